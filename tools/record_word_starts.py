"""Record transformers' word timestamps on the word-timestamp test's clips (tests/data/transformers_word_starts.json).

tests/test_word_timestamps.py compares our word starts with transformers' own
(`pipeline(..., return_timestamps="word")`) on the same tiny.en checkpoint. Running that pipeline took about a
minute of every CI run, so its answer is recorded here, with the checkpoint's fingerprint and transformers'
version; the test refuses a recording made from other weights. Run it again after changing the test models
or upgrading transformers:

    python tools/record_word_starts.py      # after the tests have exported .cache/test-models once
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import version
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from conftest import TINY_EN_DIR  # noqa: E402
from test_word_timestamps import CLIPS, RECORDED_WORD_STARTS  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(TINY_EN_DIR), help="transformers-format tiny.en (default: the tests')")
    args = ap.parse_args()
    from transformers import WhisperForConditionalGeneration, pipeline

    from asr_app.audio import load_audio
    from asr_app.distill.teacher import target_fingerprint

    model = WhisperForConditionalGeneration.from_pretrained(args.model)
    pipe = pipeline("automatic-speech-recognition", model=args.model, device="cpu")
    clips = {}
    for name, path in CLIPS.items():
        chunks = pipe(load_audio(path), return_timestamps="word")["chunks"]
        clips[name] = [[c["text"], float(c["timestamp"][0])] for c in chunks]
    record = {"made_by": "tools/record_word_starts.py", "transformers": version("transformers"),
              "model_fingerprint": target_fingerprint(model), "clips": clips}
    RECORDED_WORD_STARTS.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {sum(map(len, clips.values()))} words of {len(clips)} clips to {RECORDED_WORD_STARTS}")


if __name__ == "__main__":
    main()
