"""Output heads over the whole vocabulary or a reduced one (the draft's), and the token space they score.

A small draft spends most of a step in its output layer (V x d, tiny.en: 51864 x 384). A reduced head
scores only K token ids: every special and timestamp token, plus the K - specials most frequent text
tokens: of real English for the English-only tokenizer (asr_app/runtime/data/README.md), or of the labels a
draft made by asr-distill was trained on (its config's `draft_vocab_ranking`, written by the distillation:
the only ranking a multilingual draft has). The draft's q is then 0 outside the subset,
which the verification rules handle like any other q (an unscored token is simply never proposed), so
exact and greedy decoding stay exact. Ids are kept ascending, so the specials and timestamps, which sit
at the top of Whisper's vocabulary, stay one contiguous tail and Whisper's rules keep their shape in the
reduced index space (decoding/rules.py).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from asr_app.runtime.ops import linear, pack

log = logging.getLogger(__name__)

RANKING_FILE = Path(__file__).with_name("data") / "draft_vocab_en.txt"
ENGLISH_ONLY_VOCAB = 51864


@dataclass(frozen=True)
class TokenSpace:
    """The token ids a head scores: all `vocab` ids (ids None) or the ascending subset `ids`."""

    vocab: int
    ids: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.vocab if self.ids is None else self.ids.numel()

    @property
    def reduced(self) -> bool:
        return self.ids is not None

    def index(self, token_id: int) -> int:
        """Position of `token_id` in this space (it must be in it); host-side, for building the rules."""
        if self.ids is None:
            return token_id
        pos = int(torch.searchsorted(self.ids.cpu(), token_id))
        if pos >= self.size or int(self.ids[pos]) != token_id:
            raise ValueError(f"token {token_id} is not in this reduced vocabulary")
        return pos

    def mask(self, token_ids, device: torch.device) -> torch.Tensor:
        """bool [K]: True at the positions of `token_ids` (ids outside the space are ignored)."""
        wanted = torch.tensor(sorted(set(token_ids)), dtype=torch.long)
        if self.ids is None:
            out = torch.zeros(self.vocab, dtype=torch.bool)
            out[wanted[(wanted >= 0) & (wanted < self.vocab)]] = True
            return out.to(device)
        return torch.isin(self.ids.cpu(), wanted).to(device)

    def to_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Vocabulary ids of positions `index` in this space."""
        return index if self.ids is None else self.ids[index]

    def to_full(self, logits: torch.Tensor) -> torch.Tensor:
        """Scores [..., V] from scores over this space [..., K]: -inf at ids the space leaves out."""
        if self.ids is None:
            return logits
        full = torch.full((*logits.shape[:-1], self.vocab), float("-inf"), dtype=logits.dtype, device=logits.device)
        return full.index_copy_(-1, self.ids, logits)


@dataclass(frozen=True)
class OutputHead:
    """The output layer restricted to a token space: weight [K, d] (the rows of the tied embedding), in
    the form `ops.linear` reads fastest when built with `packed` (`ops.pack`)."""

    weight: torch.Tensor
    space: TokenSpace

    @classmethod
    def full(cls, weight: torch.Tensor, packed: bool = False, dtype: torch.dtype | None = None) -> OutputHead:
        return cls(pack(weight, dtype) if packed else weight, TokenSpace(weight.shape[0]))

    @classmethod
    def subset(cls, weight: torch.Tensor, ids: torch.Tensor, packed: bool = False,
               dtype: torch.dtype | None = None) -> OutputHead:
        ids = ids.to(device=weight.device, dtype=torch.long)
        rows = weight.index_select(0, ids).contiguous()
        return cls(pack(rows, dtype) if packed else rows, TokenSpace(weight.shape[0], ids))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return linear(hidden, self.weight)


@functools.lru_cache(maxsize=1)
def _ranking() -> tuple[int, tuple[str, ...], tuple[int, ...]]:
    """(where the check tokens start, check tokens, ranked text ids) from the shipped ranking file."""
    start, check = 0, ()
    ids: list[int] = []
    for line in RANKING_FILE.read_text().splitlines():
        if line.startswith("# check "):
            where, _, tokens = line.removeprefix("# check ").partition(":")
            start, check = int(where), tuple(tokens.split())
        elif line and not line.startswith("#"):
            ids.append(int(line))
    return start, check, tuple(ids)


RANKING_ATTR = "draft_vocab_ranking"   # in a draft's config: the text ids its head was trained on, most frequent first


def draft_ranking(draft) -> tuple[int, ...] | None:
    """The ranking a draft made by asr-distill carries in its config (None for any other draft)."""
    ranking = getattr(draft.config, RANKING_ATTR, None)
    if ranking is None:
        return None
    vocab = draft.config.vocab_size
    if not isinstance(ranking, list | tuple) or \
            not all(type(i) is int and 0 <= i < vocab for i in ranking) \
            or len(set(ranking)) != len(ranking):
        raise ValueError(f"the draft's config holds a malformed {RANKING_ATTR}: token ids below {vocab}, each once")
    return tuple(ranking)


def draft_vocabulary(tokenizer, vocab: int, eos: int, size: int,
                     ranking: Sequence[int] | None = None) -> torch.Tensor | None:
    """Ascending ids of a `size`-token draft vocabulary: all ids from `eos` up (specials, timestamps)
    and the most frequent text tokens: by the draft's own `ranking` where it has one (then at most the ids it
    ranks: the head it was trained with), else by the shipped English ranking; None (use the whole
    vocabulary) when `size` covers it or there is no ranking for this tokenizer."""
    if size >= vocab:
        return None
    if ranking is not None:
        if max(ranking, default=0) >= eos:
            raise ValueError(f"the draft's {RANKING_ATTR} ranks ids from {eos} up: those are special tokens, always scored")
        return ranked_subset(vocab, eos, min(size, len(ranking) + vocab - eos), ranking)
    if not shipped_ranking_fits(tokenizer, vocab):
        log.info("no token ranking for this tokenizer: the draft scores the whole vocabulary")
        return None
    return ranked_subset(vocab, eos, size)


def shipped_ranking_fits(tokenizer, vocab: int) -> bool:
    """Whether the shipped English ranking was made for this tokenizer (its size and sample tokens)."""
    start, check, ranked = _ranking()
    return vocab == ENGLISH_ONLY_VOCAB and \
        tuple(tokenizer.convert_ids_to_tokens(list(ranked[start : start + len(check)]))) == check


def ranked_subset(vocab: int, eos: int, size: int, ranking: Sequence[int] | None = None) -> torch.Tensor:
    """The `size` ids of `ranking` (default: the shipped English one) plus the specials and timestamps,
    without checking which tokenizer they are meant for (benchmarks of random-weight models use it for the
    shape alone)."""
    specials = vocab - eos
    if size <= specials:
        raise ValueError(f"a draft vocabulary of {size} tokens cannot hold the {specials} special and timestamp tokens")
    text = sorted((_ranking()[2] if ranking is None else ranking)[: size - specials])
    return torch.tensor(text + list(range(eos, vocab)), dtype=torch.long)
