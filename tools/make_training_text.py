"""English text for synthetic distillation speech, from what a Debian machine already holds.

    apt-get install fortunes fortunes-min
    python tools/make_training_text.py --out en.txt --lines 3000
    python tools/make_synthetic_speech.py --text en:en.txt --out synth/
    apt-get install fortunes-de fortunes-es fortunes-it fortunes-ru manpages-fr
    python tools/make_training_text.py --language de --out de.txt --lines 3000

The shipped tiny.en draft's README names its text: Debian's fortunes, the licence texts in
/usr/share/common-licenses, Python standard-library docstrings, and number/date/money templates. This
collects the same kinds of text, so the draft can be rebuilt here: passages are cut into lines of 3-45
words (one line is one clip: 45 words at espeak-ng's slowest 115 words per minute, slowed to 0.9x and
padded with silence, still fit one 30 s window), lines that read like code or ASCII art are dropped, and
the order is shuffled with --seed, so that the same machine with the same packages gives the same file.
Other languages (--language de, es, it, ru: Debian's fortunes-de/-es/-it/-ru; fr: the French manual pages
of manpages-fr, their roff markup removed) for a multilingual target's draft; templates are English only.
(The tiny.en rebuild in docs/distill.md used this tool at commit 2c07912, which cut lines of up to 75
words and let few template lines through.)
"""

from __future__ import annotations

import argparse
import ast
import gzip
import random
import re
import sys
import sysconfig
import unicodedata
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


# Where each other language's text lies: a fortunes folder, or (French) manual pages.
OTHER_FORTUNES = {"de": FORTUNES / "de", "es": FORTUNES / "es", "it": FORTUNES / "it", "ru": FORTUNES / "ru"}
FRENCH_MANUALS = Path("/usr/share/man/fr")
PACKAGES = {"en": "fortunes fortunes-min", "de": "fortunes-de", "es": "fortunes-es", "it": "fortunes-it",
            "ru": "fortunes-ru", "fr": "manpages-fr"}
# Characters of code, markup and art, which prose in any of these languages rarely has.
NOT_PROSE = set("{}[]<>=_#|\\@^~`*+")


def folder_fortunes(folder: Path) -> Iterator[str]:
    """Each fortune of every fortune file in `folder` (a language's own folder: all of it is that language)."""
    for path in sorted(p for p in folder.glob("*") if p.is_file() and p.suffix not in (".dat", ".u8")
                       and not p.is_symlink()):
        yield from path.read_text(encoding="utf-8", errors="replace").split("\n%\n")


COMBINING = {"'": "\u0301", "`": "\u0300", "^": "\u0302", ":": "\u0308", ",": "\u0327", "~": "\u0303"}


def _accented(match: re.Match) -> str:
    return unicodedata.normalize("NFC", match.group(2) + COMBINING[match.group(1)])


def roff_text(source: str) -> str:
    """A manual page's words: requests (lines starting with . or ') end a paragraph, escapes are dropped."""
    paragraphs, current = [], []
    for line in source.splitlines():
        if line.startswith((".", "'")):
            if current:
                paragraphs.append(" ".join(current))
                current = []
            continue
        line = re.sub(r"\\f(\[[^]]*\]|\(..|.)", "", line)       # font changes
        line = re.sub(r"\\\((['`^:,~])([A-Za-z])", _accented, line)  # \('e is é
        line = re.sub(r"\\\[u([0-9A-Fa-f]{4})\]", lambda m: chr(int(m.group(1), 16)), line)
        line = re.sub(r"\\\((..)", "", line)                     # other special characters
        line = line.replace("\\-", "-").replace("\\&", "").replace("\\e", "")
        line = re.sub(r"\\.", "", line)
        if line.strip():
            current.append(line.strip())
    if current:
        paragraphs.append(" ".join(current))
    return "\n\n".join(paragraphs)


def manual_passages(folder: Path = FRENCH_MANUALS) -> Iterator[str]:
    for path in sorted(folder.glob("man*/*.gz")):
        try:
            yield from roff_text(gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")).split("\n\n")
        except (OSError, EOFError):
            continue


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


# Function words, to keep the English lines that other languages' fortunes and manuals quote out of them.
FUNCTION_WORDS = {
    "en": {"the", "and", "of", "to", "is", "you", "that", "it", "with", "for", "are", "this", "be", "not"},
    "de": {"der", "die", "das", "und", "ist", "nicht", "ein", "eine", "ich", "zu", "mit", "sie", "es", "den"},
    "es": {"el", "la", "los", "las", "que", "y", "es", "un", "una", "no", "por", "con", "se", "del"},
    "it": {"il", "la", "che", "e", "di", "un", "una", "non", "per", "con", "si", "sono", "del", "della"},
    "fr": {"le", "la", "les", "et", "est", "un", "une", "des", "du", "que", "pour", "pas", "dans", "avec"},
}


def in_language(line: str, language: str) -> bool:
    """Whether `line` reads as `language` rather than English (Cyrillic letters for Russian)."""
    letters = [c for c in line if c.isalpha()]
    if language == "ru":
        return sum("\u0400" <= c <= "\u04ff" for c in letters) >= 0.8 * len(letters)
    words = [w.strip(".,;:!?'\"()").lower() for w in line.split()]
    own = sum(w in FUNCTION_WORDS[language] for w in words)
    return language == "en" or own > sum(w in FUNCTION_WORDS["en"] for w in words)


def speakable(line: str, language: str = "en") -> bool:
    words = line.split()
    prose = bool(SPEAKABLE.match(line)) if language == "en" else not (set(line) & NOT_PROSE)
    return (MIN_WORDS <= len(words) <= MAX_WORDS and prose and sum(c.isalpha() for c in line) >= 0.6 * len(line)
            and in_language(line, language))


def passages_in(language: str) -> list[str]:
    if language == "en":
        return [*fortune_passages(), *licence_passages(), *docstring_passages()]
    if language == "fr":
        return list(manual_passages())
    return list(folder_fortunes(OTHER_FORTUNES[language]))


def collect(rng: random.Random, templates: int, language: str = "en", passages: list[str] | None = None) -> list[str]:
    passages = passages_in(language) if passages is None else passages
    templates = templates if language == "en" else 0
    seen, out = set(), []
    for passage in passages:
        for line in lines_of(passage, rng):
            if speakable(line, language) and line not in seen:
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
    ap.add_argument("--language", choices=sorted(PACKAGES), default="en")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    lines = collect(rng, args.templates, args.language)
    if len(lines) <= args.templates:
        print(f"error: no {args.language} text found here (apt-get install {PACKAGES[args.language]})",
              file=sys.stderr)
        return 2
    rng.shuffle(lines)
    chosen = lines[:args.lines]
    args.out.write_text("\n".join(chosen) + "\n", encoding="utf-8")
    words = sum(len(line.split()) for line in chosen)
    print(f"wrote {len(chosen)} lines ({words} words) of {len(lines)} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
