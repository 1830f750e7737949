"""English text for synthetic distillation speech, from what a Debian machine already holds.

    apt-get install fortunes fortunes-min
    python tools/make_training_text.py --out en.txt --lines 3000
    python tools/make_synthetic_speech.py --text en:en.txt --out synth/

The shipped tiny.en draft's README names its text: Debian's fortunes, the licence texts in
/usr/share/common-licenses, Python standard-library docstrings, and number/date/money templates. This
collects the same kinds of text, so the draft can be rebuilt here: passages are cut into lines of 3-45
words (one line is one clip: 45 words at espeak-ng's slowest 115 words per minute, slowed to 0.9x and
padded with silence, still fit one 30 s window), lines that read like code or ASCII art are dropped, and
the order is shuffled with --seed, so that the same machine with the same packages gives the same file.
(The tiny.en rebuild in docs/distill.md used this tool at commit 2c07912, which cut lines of up to 75
words and let few template lines through.)
"""

from __future__ import annotations

import argparse
import ast
import random
import re
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

FORTUNES = Path("/usr/share/games/fortunes")
LICENCES = Path("/usr/share/common-licenses")
MIN_WORDS, MAX_WORDS = 3, 45
# A line is kept only if it is mostly letters and ordinary punctuation (no code, tables or art).
SPEAKABLE = re.compile(r"^[A-Za-z0-9 ,.;:!?'\"()\-$%&/]+$")


# The English files of Debian's fortunes and fortunes-min: other languages' packages (fortunes-it, ...) put
# files in the same folder, so the English ones are named, not globbed.
ENGLISH_FORTUNES = (
    "art", "ascii-art", "computers", "cookie", "debian", "definitions", "disclaimer", "drugs", "education",
    "ethnic", "food", "fortunes", "goedel", "humorists", "kids", "knghtbrd", "law", "linux", "linuxcookie",
    "literature", "love", "magic", "medicine", "men-women", "miscellaneous", "news", "paradoxum", "people",
    "perl", "pets", "platitudes", "politics", "pratchett", "riddles", "science", "songs-poems", "sports",
    "startrek", "tao", "translate-me", "wisdom", "work", "zippy")


def fortune_passages(folder: Path = FORTUNES) -> Iterator[str]:
    """Each fortune (the text between '%' lines) of every English fortune file that is installed."""
    for path in (folder / name for name in ENGLISH_FORTUNES):
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        yield from text.split("\n%\n")


def licence_passages(folder: Path = LICENCES) -> Iterator[str]:
    """The paragraphs of every licence text (GPL, LGPL, ... are links to a version: read once)."""
    for path in sorted(p for p in folder.glob("*") if p.is_file() and not p.is_symlink()):
        yield from path.read_text(encoding="utf-8", errors="replace").split("\n\n")


def docstring_passages(limit_files: int = 400) -> Iterator[str]:
    """The paragraphs of module, class and function docstrings of the standard library."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py"))[:limit_files]
    for path in files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    yield from doc.split("\n\n")


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def template_passages(rng: random.Random, count: int) -> Iterator[str]:
    """Numbers, dates, money and times, which prose rarely has and transcripts often do. They are lines as
    they stand (not cut, not held to the letter share that keeps code and art out of the prose)."""
    months = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
              "October", "November", "December"]
    shapes = [
        lambda: f"The meeting moved to {rng.choice(months)} {rng.randint(1, 28)}, {rng.randint(1950, 2030)}.",
        lambda: f"It costs ${rng.randint(1, 999)}.{rng.randint(0, 99):02d} plus {rng.randint(2, 25)} percent tax.",
        lambda: f"Call me at {rng.randint(200, 999)} {rng.randint(100, 999)} {rng.randint(1000, 9999)} after "
                f"{rng.randint(1, 12)} o'clock.",
        lambda: f"Flight {rng.randint(10, 9999)} leaves from gate {rng.randint(1, 60)} at {rng.randint(1, 12)}:"
                f"{rng.randint(0, 59):02d}.",
        lambda: f"We counted {rng.randint(2, 100000)} people and {rng.randint(2, 500)} cars on the "
                f"{ordinal(rng.randint(1, 31))} of {rng.choice(months)}.",
    ]
    for _ in range(count):
        yield rng.choice(shapes)()


def clean(passage: str) -> str:
    """One line of plain words: attributions, indentation and line breaks gone."""
    passage = re.sub(r"\n\s*--.*$", "", passage.strip(), flags=re.S)  # a fortune's "-- Author" line
    return re.sub(r"\s+", " ", passage).strip()


def lines_of(passage: str, rng: random.Random) -> Iterator[str]:
    """`passage` cut at sentence ends into lines of MIN_WORDS..MAX_WORDS words, each a random length."""
    sentences = re.split(r"(?<=[.!?])\s+", clean(passage))
    line: list[str] = []
    goal = rng.randint(MIN_WORDS, MAX_WORDS)
    for sentence in sentences:
        words = sentence.split()
        if len(line) + len(words) > MAX_WORDS and line:
            yield " ".join(line)
            line, goal = [], rng.randint(MIN_WORDS, MAX_WORDS)
        line += words
        if len(line) >= goal:
            yield " ".join(line[:MAX_WORDS])
            line, goal = [], rng.randint(MIN_WORDS, MAX_WORDS)
    if len(line) >= MIN_WORDS:
        yield " ".join(line)


def speakable(line: str) -> bool:
    words = line.split()
    return MIN_WORDS <= len(words) <= MAX_WORDS and bool(SPEAKABLE.match(line)) and \
        sum(c.isalpha() for c in line) >= 0.6 * len(line)


def collect(rng: random.Random, templates: int) -> list[str]:
    passages = [*fortune_passages(), *licence_passages(), *docstring_passages()]
    seen, out = set(), []
    for passage in passages:
        for line in lines_of(passage, rng):
            if speakable(line) and line not in seen:
                seen.add(line)
                out.append(line)
    for line in template_passages(rng, templates):
        if line not in seen:
            seen.add(line)
            out.append(line)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--lines", type=int, default=3000, help="lines written (at most what the sources hold)")
    ap.add_argument("--templates", type=int, default=300, help="number/date/money lines among the sources")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not FORTUNES.is_dir():
        print(f"error: {FORTUNES} is missing (apt-get install fortunes fortunes-min)", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    lines = collect(rng, args.templates)
    rng.shuffle(lines)
    chosen = lines[:args.lines]
    args.out.write_text("\n".join(chosen) + "\n", encoding="utf-8")
    words = sum(len(line.split()) for line in chosen)
    print(f"wrote {len(chosen)} lines ({words} words) of {len(lines)} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
