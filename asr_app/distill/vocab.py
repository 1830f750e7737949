"""The draft head's token ranking where the runtime ships none: the text tokens of the training labels.

A reduced draft head (runtime/vocab.py) scores only the most frequent text tokens plus the specials. For the
English-only tokenizer the package ships a ranking; for any other (the multilingual one, a fine-tuned
tokenizer) the labels the draft learns from are the best estimate of what it will be asked to propose: their
text tokens by count, then every other text id in the tokenizer's own order (BPE merges, roughly the most
frequent first). The ranking the head was trained with is stored in the draft's config
(runtime.vocab.RANKING_ATTR), so the runtime scores the same ids.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from asr_app.distill.cache import LabelInfo, TeacherCache


def label_ranking(cache: TeacherCache, labels: Iterable[LabelInfo], eos: int, keep: int) -> tuple[int, ...]:
    """The `keep` text ids (below `eos`) most frequent among the labels' predicted tokens, then the unseen
    ids in ascending order."""
    if keep < 1:
        raise ValueError(f"a ranking keeps at least one text token, not {keep}")
    by_record: dict[str, list[LabelInfo]] = {}
    for info in labels:
        by_record.setdefault(info.key, []).append(info)
    counts: collections.Counter[int] = collections.Counter()
    for key, infos in by_record.items():
        for info, tokens in zip(infos, cache.tokens(key, [i.index for i in infos])):
            counts.update(t for t in tokens[info.length - info.predicted :] if t < eos)
    seen = sorted(counts, key=lambda t: (-counts[t], t))
    unseen = (t for t in range(eos) if t not in counts)
    return tuple([*seen, *unseen][:keep])
