"""The decoding runtime: our own Whisper decoder step over static KV caches, reduced output heads, and
the runner that captures steps in CUDA graphs (docs/runtime.md)."""

from asr_app.runtime.decoder import DecoderRuntime, DecoderState
from asr_app.runtime.graphs import GraphMode, HostReadError, StepRunner, no_host_reads
from asr_app.runtime.vocab import OutputHead, TokenSpace, draft_vocabulary
from asr_app.runtime.weights import DecoderWeights, decoder_weights

__all__ = ["DecoderRuntime", "DecoderState", "DecoderWeights", "GraphMode", "HostReadError", "OutputHead",
           "StepRunner", "TokenSpace", "decoder_weights", "draft_vocabulary", "no_host_reads"]
