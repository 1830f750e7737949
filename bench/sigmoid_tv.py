"""How far sigmoid mode's token distribution is from the target's, per position, for many alpha/beta.

    python bench/sigmoid_tv.py [--target DIR --draft DIR] [--every 14] [--out bench/results/sigmoid_tv.json]

Decoding studies of alpha/beta are slow (every point is a full decode per clip and seed); this asks
the question per position instead, for a wide grid at once. It decodes every K-th local clip
(`asr-eval --dataset local`) in mode exact at T = 0.6 and 1.0 (seed 0, gamma 5), keeps the target's
and the draft's processed logits of every drafted position, and computes for each (alpha, beta) the
distribution sigmoid mode's rules give the first token there (draft sampled from q = softmax(z_q/T)):

    f(x) = q(x) a(x) + (1 - sum q a) r(x),  a = min(1, p_hat/q_hat),
    r = max(0, p_hat - q_hat) over the ids the draft scores, normalised (the target's softmax p if empty)

and reports its mean total-variation distance to p and the mean acceptance sum q a. Exact mode has
TV 0; accepting every draft has TV(q, p). The grid holds the symmetric alpha = -s, beta = s of the
paper and `asr-eval --sweep-scale`, and windows (alpha, alpha + w) placed where the top logits lie.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import asr_app.decoding.steps as steps_module
from asr_app.audio import load_audio
from asr_app.decoding import DecodingOptions, SpeculativeDecoder
from asr_app.eval.datasets import load_local
from asr_app.models import load_pair

SYMMETRIC = (1e3, 1e2, 30.0, 10.0, 3.0, 1.0)
WINDOWS = [(a, a + w) for a in (0.0, 5.0, 10.0, 15.0, 20.0, 25.0) for w in (1.0, 3.0, 10.0)]
TEMPERATURES = (0.6, 1.0)


def capture_rows(decoder, clips, temperatures) -> dict[float, tuple[torch.Tensor, torch.Tensor]]:
    """{T: (target logits / T, draft logits / T)} [rows, V] at every drafted position of exact-mode decodes."""
    rows: dict[float, list[tuple[torch.Tensor, torch.Tensor]]] = {t: [] for t in temperatures}
    original = steps_module.verify

    def spy(target, draft, tokens, num_draft, **kw):
        gamma = tokens.shape[1]
        if kw.get("mode") == "exact" and gamma > 0 and kw["temperature"] > 0:
            for b in range(target.shape[0]):
                n = int(num_draft[b])
                rows[kw["temperature"]].append((target[b, :n].float() / kw["temperature"],
                                                draft[b, :n].float() / kw["temperature"]))
        return original(target, draft, tokens, num_draft, **kw)

    steps_module.verify = spy
    try:
        for clip in clips:
            audio = load_audio(clip.audio_path)
            for t in temperatures:
                decoder.decode([audio], options=DecodingOptions(mode="exact", temperature=t, seed=0, gamma=5))
    finally:
        steps_module.verify = original
    return {t: (torch.cat([r[0] for r in v]), torch.cat([r[1] for r in v])) for t, v in rows.items()}


def sigmoid_tv(zt: torch.Tensor, zd: torch.Tensor, alpha: float, beta: float, chunk: int = 32) -> tuple[float, float]:
    """(mean TV(f, p), mean acceptance) over the rows, chunked to bound memory (rows x V float64)."""
    tvs, accs = [], []
    for i in range(0, zt.shape[0], chunk):
        t, d = zt[i : i + chunk].double(), zd[i : i + chunk].double()
        p, q = torch.softmax(t, -1), torch.softmax(d, -1)
        width = beta - alpha
        p_hat, q_hat = torch.sigmoid((t - alpha) / width), torch.sigmoid((d - alpha) / width)
        accept = torch.where(q_hat > 0, (p_hat / q_hat).clamp(max=1.0), torch.zeros_like(p_hat))
        resid = torch.where(torch.isfinite(d), (p_hat - q_hat).clamp(min=0.0), torch.zeros_like(p_hat))
        mass = resid.sum(-1, keepdim=True)
        r = torch.where(mass > 0, resid / mass.clamp(min=1e-300), p)
        kept = (q * accept).sum(-1, keepdim=True)
        f = q * accept + (1.0 - kept) * r
        tvs.append(0.5 * (f - p).abs().sum(-1))
        accs.append(kept[:, 0])
    return float(torch.cat(tvs).mean()), float(torch.cat(accs).mean())


def draft_tv(zt: torch.Tensor, zd: torch.Tensor) -> tuple[float, float]:
    """(mean TV(q, p), exact's mean acceptance sum min(p, q))."""
    p, q = torch.softmax(zt.double(), -1), torch.softmax(zd.double(), -1)
    return float((0.5 * (q - p).abs().sum(-1)).mean()), float(torch.minimum(p, q).sum(-1).mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="../shared/models/whisper-tiny.en")
    parser.add_argument("--draft", default="../shared/models/distil-tiny.en-draft")
    parser.add_argument("--every", type=int, default=14, help="every K-th local clip (sorted ids)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/sigmoid_tv.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    decoder = SpeculativeDecoder(load_pair(target=args.target, draft=args.draft, device="cpu"))
    clips = load_local()[:: args.every]
    rows = capture_rows(decoder, clips, TEMPERATURES)
    grid = [(-s, s) for s in SYMMETRIC] + WINDOWS
    result = {"clips": [c.id for c in clips], "temperatures": {}}
    for t, (zt, zd) in rows.items():
        tv_q, exact_acc = draft_tv(zt, zd)
        points = []
        for alpha, beta in grid:
            tv, acc = sigmoid_tv(zt, zd, alpha, beta)
            points.append({"alpha": alpha, "beta": beta, "tv": tv, "acceptance": acc})
        result["temperatures"][str(t)] = {"positions": int(zt.shape[0]), "tv_accept_all": tv_q,
                                          "exact_acceptance": exact_acc, "sigmoid": points}
        best = min(points, key=lambda x: x["tv"])
        print(f"T={t}: {zt.shape[0]} positions; accept-all TV {tv_q:.3f}; exact acceptance {exact_acc:.3f}; "
              f"sigmoid TV {min(x['tv'] for x in points):.3f}-{max(x['tv'] for x in points):.3f} "
              f"(best alpha={best['alpha']:g}, beta={best['beta']:g}, acceptance {best['acceptance']:.3f})")
        for x in points:
            print(f"  alpha={x['alpha']:>7g} beta={x['beta']:>6g}  TV {x['tv']:.3f}  acceptance {x['acceptance']:.3f}")
    result["seconds"] = round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
