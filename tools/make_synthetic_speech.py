"""Synthetic speech for asr-distill: sentences in text files spoken in random voices (espeak-ng, flite, festival), augmented.

    python tools/make_synthetic_speech.py --text en:sentences_en.txt --text de:saetze.txt --out synth/ --repeat 3
    python tools/make_synthetic_speech.py --text it:frasi.txt --engines espeak-ng,festival --out synth/
    python tools/make_synthetic_speech.py --augment real-speech/ --copies 4 --out synth/
    asr-distill --target openai/whisper-base --audio synth/ real-speech/ --eval-audio held-out/ --out drafts/base

Each line of a text file is one sentence (blank lines and lines starting with # are skipped); each sentence is
spoken --repeat times, each time in another voice, rate and pitch, with noise, reverb, speed and level
changes unless --no-augment. Files land in OUT/<language>/, with OUT/manifest.jsonl saying how each was made.
--augment makes --copies augmented versions of every audio file under the given folders (OUT/real/).
tools/make_training_text.py makes an English text file from Debian's fortunes, licences and Python's docs.
Needs Debian's espeak-ng (apt-get install espeak-ng); --engines adds flite (English voices) and festival
(English, Italian, Russian), whose packages asr_app/distill/voices.py names. See docs/distill.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from asr_app.distill.data import audio_files
from asr_app.distill.synth import AugmentOptions, augment_files, generate
from asr_app.distill.voices import ENGINES, PACKAGES, VOICES, SynthError, engine_available


def sentences(specs: list[str], repeat: int) -> list[tuple[str, str]]:
    out = []
    for spec in specs:
        language, _, path = spec.partition(":")
        if language not in VOICES or not path:
            raise ValueError(f"--text {spec!r}: expected LANG:FILE with LANG one of {', '.join(VOICES)}")
        lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
        out += [(language, line) for line in lines if line and not line.startswith("#")] * repeat
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", action="append", default=[], metavar="LANG:FILE")
    ap.add_argument("--augment", nargs="+", type=Path, default=[], metavar="DIR",
                    help="real recordings to write augmented copies of")
    ap.add_argument("--copies", type=int, default=4, help="augmented copies per --augment file")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=1, help="voices per sentence")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-augment", action="store_true")
    ap.add_argument("--engines", default="espeak-ng",
                    help=f"speech engines whose voices speak the text, comma-separated: {', '.join(ENGINES)} "
                         "(each language's voices come from those that speak it)")
    args = ap.parse_args(argv)
    if not args.text and not args.augment:
        ap.error("give --text LANG:FILE and/or --augment DIR")
    if args.augment and (args.no_augment or args.copies < 1):
        ap.error("--augment writes augmented copies: it needs --copies >= 1 and no --no-augment")
    engines = tuple(e.strip() for e in args.engines.split(",") if e.strip())
    if not engines or (unknown := [e for e in engines if e not in ENGINES]):
        ap.error(f"--engines: {', '.join(unknown) + ' unknown' if engines else 'none given'}; "
                 f"choose from {', '.join(ENGINES)}")
    if args.text and (missing := [e for e in engines if not engine_available(e)]):
        print("error: " + "; ".join(f"{e} is not installed (apt-get install {PACKAGES[e]})" for e in missing),
              file=sys.stderr)
        return 2
    try:
        todo = sentences(args.text, max(1, args.repeat))
        real, missing = audio_files(args.augment)
        if missing or (args.augment and not real):
            raise ValueError("; ".join(missing) or f"no audio files under {', '.join(map(str, args.augment))}")
        skipped: list[tuple[str, str, str]] = []
        with tqdm(total=len(todo) + len(real), unit="clip", disable=None) as bar:
            written = generate(todo, args.out, args.seed, None if args.no_augment else AugmentOptions(),
                               progress=lambda: bar.update(), engines=engines,
                               skip=lambda language, text, reason: skipped.append((language, text, reason)))
            written += augment_files(real, args.out, args.copies, args.seed, progress=lambda: bar.update())
    except (OSError, ValueError, SynthError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if skipped:
        language, text, reason = skipped[0]
        print(f"skipped {len(skipped)} sentence(s) their voice could not speak; the first ({language}): "
              f"{text[:60]!r}: {reason}", file=sys.stderr)
    if todo and len(skipped) == len(todo):
        print("error: no voice could speak any sentence: no clips written", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} clips to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
