"""tests/token_lists.py (the GPU tests' comparison of whole token lists) on crafted logits, on the CPU."""

from __future__ import annotations

import pytest
import torch
from token_lists import check_same_or_near_ties, divergences

VOCAB, EOS, MARGIN = 12, 11, 0.25


def target(choices: dict[tuple[int, ...], dict[int, float]], default: list[int]):
    """logits_along for a made-up target: after prefix p, the logits `choices[p]` (token -> logit, others
    -5), or else a clear preference for default[len(p)] (EOS after the last)."""
    def logits_along(path: list[int]) -> torch.Tensor:
        rows = []
        for j in range(len(path) + 1):
            row = torch.full((VOCAB,), -5.0)
            prefix = tuple(path[:j])
            if prefix in choices:
                for token, logit in choices[prefix].items():
                    row[token] = logit
            else:
                row[default[j] if j < len(default) else EOS] = 5.0
            rows.append(row)
        return torch.stack(rows)
    return logits_along


REFERENCE = [1, 2, 3, 4, 5]


def test_identical_lists_have_no_divergence():
    assert divergences(REFERENCE, REFERENCE, target({}, REFERENCE), EOS) == []
    assert check_same_or_near_ties(REFERENCE, REFERENCE, target({}, REFERENCE), EOS, MARGIN, "same",
                                   may_differ=False) == []


def test_a_near_tie_then_the_targets_own_choices_passes(capsys):
    # at position 2 the target hesitates between 3 and 7 (0.1 apart); after 7 it prefers 8, 9
    got = [1, 2, 7, 8, 9]
    logits = target({(1, 2): {3: 2.0, 7: 1.9}, (1, 2, 7): {8: 4.0}, (1, 2, 7, 8): {9: 4.0},
                     (1, 2, 7, 8, 9): {EOS: 4.0}}, REFERENCE)
    [d] = check_same_or_near_ties(got, REFERENCE, logits, EOS, MARGIN, "fp16 row 0")
    assert (d.position, d.token, d.preferred, d.against) == (2, 7, 3, "reference") and d.gap == pytest.approx(0.1)
    assert "fp16 row 0: token 2: 7 where the reference has 3, logit gap 0.100" in capsys.readouterr().out


def test_a_wide_divergence_fails():
    got = [1, 2, 7, 8, 9]
    logits = target({(1, 2): {3: 2.0, 7: 0.5}}, REFERENCE)
    with pytest.raises(AssertionError, match="beyond the near-tie margin"):
        check_same_or_near_ties(got, REFERENCE, logits, EOS, MARGIN, "row 0")


def test_a_bad_token_after_a_near_tie_fails():
    # the first part is a fair near tie; later the list leaves the target's clear choice (9) for 10: a check
    # that stopped at the first difference would pass this list
    got = [1, 2, 7, 8, 10]
    logits = target({(1, 2): {3: 2.0, 7: 1.9}, (1, 2, 7): {8: 4.0}, (1, 2, 7, 8): {9: 4.0, 10: 1.0}}, REFERENCE)
    found = divergences(got, REFERENCE, logits, EOS)
    assert [(d.position, d.against) for d in found] == [(2, "reference"), (4, "target")]
    with pytest.raises(AssertionError, match=r"token 4: 10 where the target prefers 9, logit gap 3\.000"):
        check_same_or_near_ties(got, REFERENCE, logits, EOS, MARGIN, "row 0")


def test_every_near_tie_is_reported(capsys):
    got = [1, 6, 3, 7, 5]  # two separate near ties: each counted and printed
    logits = target({(1,): {2: 1.0, 6: 0.95}, (1, 6): {3: 3.0}, (1, 6, 3): {4: 1.0, 7: 0.9},
                     (1, 6, 3, 7): {5: 3.0}}, REFERENCE)
    found = check_same_or_near_ties(got, REFERENCE, logits, EOS, MARGIN, "row 1")
    assert [d.position for d in found] == [1, 3]
    assert capsys.readouterr().out.count("row 1: token") == 2


def test_no_divergence_where_none_may_be():
    logits = target({(1, 2): {3: 2.0, 7: 1.99}}, REFERENCE)
    with pytest.raises(AssertionError, match="where none may be"):
        check_same_or_near_ties([1, 2, 7, 4, 5], REFERENCE, logits, EOS, MARGIN, "fp32", may_differ=False)


def test_stopping_early_or_late_is_a_divergence_too():
    # the decode ended after 4 tokens: end-of-text against the reference's 5, a near tie here
    logits = target({(1, 2, 3, 4): {5: 1.0, EOS: 0.9}}, REFERENCE)
    [d] = divergences([1, 2, 3, 4], REFERENCE, logits, EOS)
    assert (d.position, d.token, d.preferred) == (4, EOS, 5)
    # it went on past the reference's end where the target clearly stops: caught
    longer = divergences([1, 2, 3, 4, 5, 6], REFERENCE, target({}, REFERENCE), EOS)
    assert (longer[0].position, longer[0].token, longer[0].preferred) == (5, 6, EOS) and longer[0].gap == 10.0
    # a list cut by the token budget did not choose end-of-text: its end is not checked
    assert divergences(REFERENCE[:4], REFERENCE[:4], target({}, REFERENCE), EOS, got_ended=False,
                       expected_ended=False) == []


def test_a_forbidden_token_is_never_a_near_tie():
    logits = target({(1, 2): {3: 2.0, 7: float("-inf")}}, REFERENCE)  # 7 is suppressed by Whisper's rules
    with pytest.raises(AssertionError, match="beyond the near-tie margin"):
        check_same_or_near_ties([1, 2, 7, 4, 5], REFERENCE, logits, EOS, MARGIN, "row 0")
