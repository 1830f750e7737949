"""Write the distilled tiny.en draft into the package, without the tensors it shares with tiny.en.

The draft's token embedding (also its output layer) and positional embedding were frozen at tiny.en's
values during distillation, so they are tiny.en's bit for bit; the package ships only the draft's own
tensors (2 decoder layers and the final norm, float16, ~10 MB) plus a SHA-256 of tiny.en's token
embedding, and `asr_app.models.bundled` joins them with the target's embedding at load time.

    python tools/bundle_draft.py --draft ../shared/models/distil-tiny.en-draft
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from asr_app.distill.export import SHARED
from asr_app.models.bundled import embedding_fingerprint

OUT = Path(__file__).resolve().parents[1] / "asr_app" / "models" / "data" / "distil-tiny.en-draft"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", type=Path, required=True)
    args = ap.parse_args()
    tensors = load_file(args.draft / "model.safetensors")
    fingerprint = embedding_fingerprint(tensors["model.decoder.embed_tokens.weight"])
    own = {k: v.to(torch.float16).contiguous() for k, v in tensors.items() if k not in SHARED}
    OUT.mkdir(parents=True, exist_ok=True)
    save_file(own, str(OUT / "draft.safetensors"),
              metadata={"embed_sha256": fingerprint})
    for name in ("config.json", "generation_config.json"):
        shutil.copy(args.draft / name, OUT / name)
    print(f"wrote {len(own)} tensors ({sum(v.numel() for v in own.values()) / 1e6:.2f} M parameters) to {OUT}")
    print(json.dumps({"embed_sha256": fingerprint}))


if __name__ == "__main__":
    main()
