"""Build tests/data from the team's shared folder (run once; the tests then need nothing outside the repo).

- audio/: jfk.flac, the 4 LibriSpeech test-clean utterances and LJ001-0001..0008, each as 16 kHz mono
  16-bit FLAC (downmixed and resampled with soxr, as asr_app.audio.load_audio does), with their
  transcripts in the datasets' own layouts (jfk.txt, *.trans.txt, metadata.csv).
- tiny_en_reference.json: facts of the transformers-format tiny.en (../shared/models/whisper-tiny.en),
  recorded so the tests can check our CTranslate2 reader against an independent source: a SHA-256 of
  every tensor (as float16), the configs, what its tokenizer makes of real ids and text, and its greedy
  tokens on the clips.

    python tools/make_test_data.py --shared ../shared
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from transformers import WhisperForConditionalGeneration, WhisperProcessor

from asr_app.audio import load_audio

OUT = Path(__file__).resolve().parents[1] / "tests" / "data"
LJ_IDS = [f"LJ001-{i:04d}" for i in range(1, 9)]
TOKENIZER_IDS = [50257, 50363, 843, 523, 616, 5891, 3399, 1265, 407, 644, 534, 1499, 460, 466, 329, 345, 11, 50860,
                 50860, 1265, 644, 345, 460, 466, 329, 534, 1499, 13, 51012, 50256]
TOKENIZER_TEXT = " He was not an ill-disposed young man, unless to be rather cold-hearted."
CONFIG_KEYS = ["vocab_size", "d_model", "num_mel_bins", "encoder_layers", "decoder_layers", "encoder_attention_heads",
               "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_source_positions",
               "max_target_positions", "decoder_start_token_id", "eos_token_id", "pad_token_id", "suppress_tokens",
               "begin_suppress_tokens", "tie_word_embeddings", "activation_function", "scale_embedding"]
GENERATION_KEYS = ["decoder_start_token_id", "eos_token_id", "suppress_tokens", "begin_suppress_tokens",
                   "no_timestamps_token_id", "prev_sot_token_id", "max_initial_timestamp_index", "is_multilingual",
                   "alignment_heads", "forced_decoder_ids", "max_length"]


def write_flac(audio: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), audio, 16_000, subtype="PCM_16", format="FLAC")


def audio(shared: Path) -> list[Path]:
    src, dst = shared / "audio", OUT / "audio"
    written = [dst / "jfk" / "jfk.flac"]
    write_flac(load_audio(src / "jfk" / "jfk.flac"), written[0])
    shutil.copy(src / "jfk" / "jfk.txt", dst / "jfk" / "jfk.txt")
    for flac in sorted((src / "librispeech").rglob("*.flac")):  # already 16 kHz mono FLAC: copied as they are
        target = dst / flac.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(flac, target)
        written.append(target)
    for trans in (src / "librispeech").rglob("*.trans.txt"):
        shutil.copy(trans, dst / trans.relative_to(src))
    lines = [line for line in (src / "ljspeech" / "metadata.csv").read_text().splitlines()
             if line.split("|")[0] in LJ_IDS]
    (dst / "ljspeech" / "wavs").mkdir(parents=True, exist_ok=True)
    (dst / "ljspeech" / "metadata.csv").write_text("\n".join(lines) + "\n")
    for utt in LJ_IDS:
        written.append(dst / "ljspeech" / "wavs" / f"{utt}.flac")
        write_flac(load_audio(src / "ljspeech" / "wavs" / f"{utt}.wav"), written[-1])
    return written


def jsonable(value):
    return value.tolist() if isinstance(value, torch.Tensor) else value


def reference(shared: Path, clips: list[Path]) -> dict:
    folder = shared / "models" / "whisper-tiny.en"
    model = WhisperForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    processor = WhisperProcessor.from_pretrained(folder)
    tensors = {name: [list(t.shape), hashlib.sha256(t.half().contiguous().numpy().tobytes()).hexdigest()]
               for name, t in model.state_dict().items()}
    tokenizer = processor.tokenizer
    decoded = {json.dumps(kw): tokenizer.decode(TOKENIZER_IDS, **kw)
               for kw in ({}, {"skip_special_tokens": True}, {"decode_with_timestamps": True})}
    offsets = tokenizer.decode(TOKENIZER_IDS, output_offsets=True)["offsets"]
    greedy = {}
    for path in clips:
        feats = processor.feature_extractor(load_audio(path), sampling_rate=16_000, return_tensors="pt").input_features
        with torch.inference_mode():
            greedy[path.relative_to(OUT / "audio").as_posix()] = model.generate(feats, do_sample=False)[0].tolist()
    return {
        "source": "../shared/models/whisper-tiny.en (transformers format), by tools/make_test_data.py",
        "tensors_float16_sha256": tensors,
        "config": {k: jsonable(getattr(model.config, k)) for k in CONFIG_KEYS},
        "generation_config": {k: jsonable(getattr(model.generation_config, k)) for k in GENERATION_KEYS},
        "tokenizer": {"ids": TOKENIZER_IDS, "decoded": decoded, "offsets": offsets, "text": TOKENIZER_TEXT,
                      "text_ids": tokenizer(TOKENIZER_TEXT).input_ids, "prefix_tokens": tokenizer.prefix_tokens},
        "greedy_tokens": greedy,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared")
    args = ap.parse_args()
    clips = audio(args.shared)
    (OUT / "tiny_en_reference.json").write_text(json.dumps(reference(args.shared, clips), indent=1) + "\n")
    total = sum(p.stat().st_size for p in (OUT / "audio").rglob("*") if p.is_file())
    print(f"wrote {len(clips)} clips ({total / 1e6:.2f} MB) and tiny_en_reference.json to {OUT}")


if __name__ == "__main__":
    main()
