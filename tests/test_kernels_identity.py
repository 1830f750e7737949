"""Triton kernels vs their PyTorch references: identical tokens given the same random numbers.

The kernels run on the CPU through Triton's interpreter (TRITON_INTERPRET=1, set in conftest).
Every call mixes the cases the issue names: a ragged num_draft, suppressed (-inf) entries, ids only
the draft leaves at -inf (a reduced draft head, ``runtime/vocab.py`` ``to_full``), a row whose draft
equals the target (all accepted), a row whose drafted ids have p = 0 (none accepted), and a drafted
id with p = 0 in the middle of a row.
"""

from __future__ import annotations

import pytest
import torch

from asr_app.kernels import VerifyResult, draw_randomness, verify
from asr_app.kernels.exact import verify_exact_torch, verify_exact_triton
from asr_app.kernels.greedy import verify_greedy_torch, verify_greedy_triton
from asr_app.kernels.sigmoid import verify_sigmoid_torch, verify_sigmoid_triton

CPU = torch.device("cpu")
SIGMOID_ALPHA, SIGMOID_BETA = -4.0, 4.0  # narrow enough that sigmoid mode rejects drafts


def make_case(batch: int, gamma: int, vocab: int, dtype: torch.dtype, seed: int):
    """Random logits with every awkward feature; returns tensors plus per-row expectations."""
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, gamma + 1, vocab, generator=gen) * 2.0
    draft = target[:, :gamma] + 0.7 * torch.randn(batch, gamma, vocab, generator=gen)
    # Suppressed tokens: about a fifth of each row is -inf (never the whole row).
    suppress = torch.rand(batch, gamma + 1, vocab, generator=gen) < 0.2
    suppress[..., 0] = False
    target = target.masked_fill(suppress, float("-inf"))
    draft = draft.masked_fill(suppress[:, :gamma], float("-inf"))
    # A reduced draft head: another tenth of the ids is scored by the target only.
    unscored = torch.rand(batch, 1, vocab, generator=gen) < 0.1
    unscored[..., 0] = False
    draft = draft.masked_fill(unscored, float("-inf"))
    q = torch.softmax(draft.reshape(-1, vocab), dim=-1)
    tokens = torch.multinomial(q, 1, generator=gen).reshape(batch, gamma)
    num_draft = torch.randint(0, gamma + 1, (batch,), generator=gen)
    num_draft[0] = gamma  # at least one full row
    all_accepted = torch.zeros(batch, dtype=torch.bool)
    none_accepted = torch.zeros(batch, dtype=torch.bool)
    if batch >= 2:  # row 1: draft distribution equals the target's -> every draft accepted
        draft[1] = target[1, :gamma]
        tokens[1] = torch.multinomial(torch.softmax(draft[1], dim=-1), 1, generator=gen)[:, 0]
        num_draft[1] = gamma
        all_accepted[1] = True
    if batch >= 3:  # row 2: p = 0 at every drafted id -> nothing accepted
        target[2, torch.arange(gamma), tokens[2]] = float("-inf")
        num_draft[2] = gamma
        none_accepted[2] = True
    if gamma >= 3:  # row 0: p = 0 at the drafted id of position 2 -> at most 2 accepted
        target[0, 2, tokens[0, 2]] = float("-inf")
    return target.to(dtype), draft.to(dtype), tokens, num_draft, all_accepted, none_accepted


def assert_same(torch_result: VerifyResult, triton_result: VerifyResult) -> None:
    assert triton_result.tokens.dtype == torch.int64 and triton_result.num_accepted.dtype == torch.int64
    assert torch.equal(torch_result.num_accepted, triton_result.num_accepted), (
        torch_result.num_accepted, triton_result.num_accepted)
    assert torch.equal(torch_result.tokens, triton_result.tokens), (torch_result.tokens, triton_result.tokens)


def assert_well_formed(result: VerifyResult, tokens, num_draft, vocab, all_accepted, none_accepted) -> None:
    batch, gamma = tokens.shape
    assert result.tokens.shape == (batch, gamma + 1)
    for b in range(batch):
        n = int(result.num_accepted[b])
        assert 0 <= n <= int(num_draft[b])
        assert torch.equal(result.tokens[b, :n], tokens[b, :n])
        assert 0 <= int(result.tokens[b, n]) < vocab
        assert bool((result.tokens[b, n + 1 :] == -1).all())
    assert bool((result.num_accepted[all_accepted] == num_draft[all_accepted]).all())
    assert bool((result.num_accepted[none_accepted] == 0).all())


# The launch geometry (tile width, tiles per split, splits: triton_support.launch_geometry) depends on the
# vocabulary only, and the kernels load either dtype into float32 the same way at any vocabulary; so each real
# vocabulary runs in one dtype (tiny.en's 51864 in float16, as on a GPU; large-v3's 51866 in float32), both
# ending inside their last tile, and 37 (less than one tile) in both dtypes.
VOCAB_DTYPES = ((37, torch.float16), (37, torch.float32), (51864, torch.float16), (51866, torch.float32))
GRID = [
    pytest.param(batch, gamma, vocab, dtype, id=f"B{batch}-g{gamma}-V{vocab}-{str(dtype)[6:]}")
    for batch in (1, 3)
    for gamma in (1, 5, 20)
    for vocab, dtype in VOCAB_DTYPES
]


@pytest.mark.parametrize("batch,gamma,vocab,dtype", GRID)
def test_exact_triton_matches_torch(batch, gamma, vocab, dtype):
    target, draft, tokens, nd, all_acc, none_acc = make_case(batch, gamma, vocab, dtype, seed=gamma * 7 + batch)
    rnd = draw_randomness(batch, gamma, CPU, torch.Generator().manual_seed(vocab + gamma))
    expected = verify_exact_torch(target, draft, tokens, nd, rnd)
    assert_well_formed(expected, tokens, nd, vocab, all_acc, none_acc)
    assert_same(expected, verify_exact_triton(target, draft, tokens, nd, rnd))


@pytest.mark.parametrize("batch,gamma,vocab,dtype", GRID)
def test_sigmoid_triton_matches_torch(batch, gamma, vocab, dtype):
    target, draft, tokens, nd, all_acc, none_acc = make_case(batch, gamma, vocab, dtype, seed=gamma * 5 + batch)
    rnd = draw_randomness(batch, gamma, CPU, torch.Generator().manual_seed(vocab * 3 + gamma))
    args = (target, draft, tokens, nd, rnd, 1.0, SIGMOID_ALPHA, SIGMOID_BETA)
    expected = verify_sigmoid_torch(*args)
    assert_well_formed(expected, tokens, nd, vocab, all_acc, none_acc)
    assert_sigmoid_residual_on_scored_ids(expected, draft, nd)
    assert_same(expected, verify_sigmoid_triton(*args))


def assert_sigmoid_residual_on_scored_ids(result: VerifyResult, draft, num_draft) -> None:
    """After a rejection at n, sigmoid's next token is one the draft scores at n (its residual is restricted
    to those ids; on these cases it is never empty, which would fall back to the target's softmax)."""
    rejected = (result.num_accepted < num_draft).nonzero()[:, 0]
    for b in rejected.tolist():
        n = int(result.num_accepted[b])
        assert float(draft[b, n, result.tokens[b, n]]) > float("-inf"), (b, n, result.tokens[b])


@pytest.mark.parametrize("batch,gamma,vocab,dtype", GRID)
def test_greedy_triton_matches_torch(batch, gamma, vocab, dtype):
    target, _, tokens, nd, _, none_acc = make_case(batch, gamma, vocab, dtype, seed=gamma * 3 + batch)
    # Make some drafts the target's argmax so prefixes of several tokens get accepted.
    argmax = target[:, :gamma].float().argmax(dim=-1)
    keep = torch.rand(batch, gamma, generator=torch.Generator().manual_seed(gamma)) < 0.8
    tokens = torch.where(keep & ~none_acc[:, None], argmax, tokens)
    expected = verify_greedy_torch(target, tokens, nd)
    assert_well_formed(expected, tokens, nd, vocab, torch.zeros(batch, dtype=torch.bool), none_acc)
    assert_same(expected, verify_greedy_triton(target, tokens, nd))


@pytest.mark.parametrize("mode", ["exact", "sigmoid"])
def test_sampling_kernels_with_default_parameters_bf16_temperature_and_strided_input(mode):
    # Paper's sigmoid constants, bf16, temperature 0.7, a non-contiguous view as the model gives.
    target, draft, tokens, nd, *_ = make_case(3, 5, 51866, torch.bfloat16, seed=11)
    wide = torch.cat([target, target[:, :1]], dim=1)[:, :6]  # a view with a larger row stride
    rnd = draw_randomness(3, 5, CPU, torch.Generator().manual_seed(5))
    if mode == "exact":
        assert_same(verify_exact_torch(wide, draft, tokens, nd, rnd, 0.7),
                    verify_exact_triton(wide, draft, tokens, nd, rnd, 0.7))
    else:
        args = (wide, draft, tokens, nd, rnd, 0.7, -1e3, 1e3)
        assert_same(verify_sigmoid_torch(*args), verify_sigmoid_triton(*args))


@pytest.mark.parametrize("block_v,tiles", [(16, 1), (16, 3), (64, 2)])
def test_exact_and_sigmoid_agree_for_any_tiling(block_v, tiles):
    # Many splits and tiles per split: exercises the per-split partials and the split search.
    target, draft, tokens, nd, *_ = make_case(3, 5, 37, torch.float32, seed=block_v + tiles)
    for seed in range(2):
        rnd = draw_randomness(3, 5, CPU, torch.Generator().manual_seed(seed))
        assert_same(verify_exact_torch(target, draft, tokens, nd, rnd),
                    verify_exact_triton(target, draft, tokens, nd, rnd, block_v=block_v, tiles=tiles))
        args = (target, draft, tokens, nd, rnd, 1.0, SIGMOID_ALPHA, SIGMOID_BETA)
        assert_same(verify_sigmoid_torch(*args), verify_sigmoid_triton(*args, block_v=block_v, tiles=tiles))
        assert_same(verify_greedy_torch(target, tokens, nd),
                    verify_greedy_triton(target, tokens, nd, block_v=block_v, tiles=tiles))


def test_zero_drafts_gives_one_token_from_the_target():
    gen = torch.Generator().manual_seed(3)
    target = torch.randn(2, 1, 37, generator=gen)
    draft = torch.empty(2, 0, 37)
    tokens = torch.empty(2, 0, dtype=torch.int64)
    nd = torch.zeros(2, dtype=torch.int64)
    rnd = draw_randomness(2, 0, CPU, gen)
    for torch_fn, triton_fn in ((verify_exact_torch, verify_exact_triton),
                                (verify_sigmoid_torch, verify_sigmoid_triton)):
        expected = torch_fn(target, draft, tokens, nd, rnd)
        assert expected.tokens.shape == (2, 1) and expected.num_accepted.tolist() == [0, 0]
        assert_same(expected, triton_fn(target, draft, tokens, nd, rnd))
    greedy = verify_greedy_triton(target, tokens, nd)
    assert greedy.tokens[:, 0].tolist() == target[:, 0].argmax(-1).tolist()


def test_greedy_ties_go_to_the_lowest_id():
    # Integer-valued logits tie often; torch.argmax picks the first maximum and so must the kernel.
    gen = torch.Generator().manual_seed(0)
    target = torch.randint(-2, 3, (3, 6, 51864), generator=gen).float()
    tokens = target[:, :5].argmax(-1)
    nd = torch.tensor([5, 3, 0])
    expected = verify_greedy_torch(target, tokens, nd)
    assert expected.num_accepted.tolist() == [5, 3, 0]
    assert_same(expected, verify_greedy_triton(target, tokens, nd, block_v=4096, tiles=2))


def test_verify_on_cpu_uses_the_torch_reference_with_the_generator_stream():
    target, draft, tokens, nd, *_ = make_case(3, 5, 37, torch.float32, seed=1)
    for mode, reference in (("exact", verify_exact_torch), ("sigmoid", verify_sigmoid_torch)):
        result = verify(target, draft, tokens, nd, mode=mode, alpha=SIGMOID_ALPHA, beta=SIGMOID_BETA,
                        generator=torch.Generator().manual_seed(9))
        rnd = draw_randomness(3, 5, CPU, torch.Generator().manual_seed(9))
        extra = (1.0,) if mode == "exact" else (1.0, SIGMOID_ALPHA, SIGMOID_BETA)
        assert_same(reference(target, draft, tokens, nd, rnd, *extra), result)


@pytest.mark.parametrize("mode", ["exact", "sigmoid"])
def test_draft_logits_in_their_own_dtype_and_one_hot_drafts(mode):
    # The draft may run in bf16 next to an fp32 target (ModelPair.draft_dtype), and a hint is a draft
    # with q = one-hot (0 at the token, -inf elsewhere): both go through the kernels as they are.
    target, draft, tokens, nd, *_ = make_case(3, 5, 51864, torch.float32, seed=21)
    one_hot = torch.full_like(draft, float("-inf")).scatter_(-1, tokens[..., None], 0.0)
    for draft_logits in (draft.to(torch.bfloat16), one_hot):
        rnd = draw_randomness(3, 5, CPU, torch.Generator().manual_seed(2))
        if mode == "exact":
            assert_same(verify_exact_torch(target, draft_logits, tokens, nd, rnd),
                        verify_exact_triton(target, draft_logits, tokens, nd, rnd))
        else:
            args = (target, draft_logits, tokens, nd, rnd, 1.0, SIGMOID_ALPHA, SIGMOID_BETA)
            assert_same(verify_sigmoid_torch(*args), verify_sigmoid_triton(*args))
