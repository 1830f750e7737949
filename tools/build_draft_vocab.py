"""Rank the English-only Whisper tokenizer's text tokens by how often they occur in real English.

The reduced-vocabulary draft head (asr_app/runtime/vocab.py) scores only the first K text tokens of
this ranking. First come the tokens a transcript needs whatever its words: the 256 single bytes, the
numbers up to four digits and short punctuation (wordfreq counts neither). Then every other token by
frequency, from wordfreq's "large" English list (word frequencies measured over subtitles, Wikipedia,
books, news, web text and social media; CC BY-SA 4.0): each word's frequency is spread over the tokens
of its usual spellings in a transcript (mid-sentence, capitalised, sentence start), and tokens are ranked
by the summed frequency. The output is data derived from wordfreq and carries its licence
(asr_app/runtime/data/README.md).

    pip install wordfreq && python tools/build_draft_vocab.py --tokenizer ../shared/models/whisper-tiny.en
"""

from __future__ import annotations

import argparse
import collections
import re
from importlib.metadata import version
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "asr_app" / "runtime" / "data" / "draft_vocab_en.txt"
# How a word is spelled in a Whisper transcript: mid-sentence, capitalised (names, titles), first word.
FORMS = ((" {w}", 0.8), (" {W}", 0.15), ("{W}", 0.05))
ALWAYS = re.compile(r" ?[0-9]{1,4}| ?[.,!?;:'\"()\-]{1,3}")  # numbers and punctuation, with or without a space


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="an English-only Whisper checkpoint directory")
    ap.add_argument("--words", type=int, default=100_000)
    ap.add_argument("--keep", type=int, default=32_768)
    args = ap.parse_args()
    import wordfreq
    from transformers import WhisperTokenizerFast

    tokenizer = WhisperTokenizerFast.from_pretrained(args.tokenizer)
    words = wordfreq.top_n_list("en", args.words, wordlist="large")
    spelled = [(form.format(w=w, W=w[:1].upper() + w[1:]), share) for w in words for form, share in FORMS]
    encoded = tokenizer._tokenizer.encode_batch([s for s, _ in spelled], add_special_tokens=False)
    mass: collections.Counter[int] = collections.Counter()
    for (_, share), enc, word in zip(spelled, encoded, [w for w in words for _ in FORMS]):
        frequency = wordfreq.word_frequency(word, "en", wordlist="large") * share
        for token in enc.ids:
            mass[token] += frequency
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    always = [t for t in range(eos) if t < 256 or ALWAYS.fullmatch(tokenizer.decode([t]))]
    ranked = (always + [t for t, _ in mass.most_common() if t < eos and t not in set(always)])[: args.keep]
    sample = tokenizer.convert_ids_to_tokens(ranked[len(always) : len(always) + 16])  # word tokens: tokenizer-specific
    header = [f"# English-only Whisper tokenizer (vocabulary {len(tokenizer)}); text token ids, most frequent first.",
              f"# Derived from wordfreq {version('wordfreq')} (CC BY-SA 4.0) by tools/build_draft_vocab.py.",
              f"# check {len(always)}: " + " ".join(sample)]
    OUT.write_text("\n".join(header + [str(t) for t in ranked]) + "\n")
    print(f"wrote {len(ranked)} ranked ids to {OUT}")


if __name__ == "__main__":
    main()
