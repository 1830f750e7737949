"""The decoding runtime: our own Whisper encoder forward and decoder step over static KV caches, reduced output heads, and
the runner that captures steps in CUDA graphs (docs/runtime.md)."""

from asr_app.runtime.decoder import DecoderRuntime, DecoderState
from asr_app.runtime.encoder import EncoderRuntime
from asr_app.runtime.graphs import GraphMode, HostReadError, StepRunner, no_host_reads
from asr_app.runtime.vocab import OutputHead, TokenSpace, draft_vocabulary
from asr_app.runtime.weights import DecoderWeights, decoder_weights

__all__ = ["DecoderRuntime", "DecoderState", "DecoderWeights", "EncoderRuntime", "GraphMode", "HostReadError", "OutputHead",
           "StepRunner", "TokenSpace", "decoder_weights", "draft_vocabulary", "no_host_reads"]
