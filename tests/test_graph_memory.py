"""Captured steps hold bounded memory (runtime/graphs.StepRunner): at most `RuntimeOptions.max_graphs` keys per
workspace, least recently used dropped, reported by `stats()`, one memory pool per workspace (emulated:
another key's replay overwrites the previous key's outputs), and no per-step value baked into a graph
without being part of its key. On the emulator, with tiny random Whisper models."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_decoding_greedy import make_pair, perturbed_copy, processor, tiny_target  # noqa: F401

from asr_app.decoding import DecodingOptions, RuntimeOptions, SpeculativeDecoder
from asr_app.decoding.workspaces import DEFAULT_WORKSPACES
from asr_app.runtime.graphs import DEFAULT_MAX_GRAPHS, BakedValueError, StepRunner

SOURCE_POSITIONS = 25  # a 50-frame window: the encoder costs nothing
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices: a second thread only waits


def doubled(*, positions, span, mask, x, scale: float = 1.0) -> dict[str, torch.Tensor]:
    return {"y": x * 2 * scale + positions.float().sum(), "flag": x > 0, "count": (x * 0).long() + 3}


def test_the_runner_keeps_at_most_max_graphs_keys_dropping_the_least_recently_used():
    runner = StepRunner("emulate", 8, max_graphs=2)
    x = {"x": torch.ones(2)}
    for key in ("a", "b", "a", "c"):  # "b" is the least recently used when "c" needs room
        runner.run((key,), doubled, x, 0, 1)
    assert list(runner.captured) == [("a",), ("c",)]
    stats = runner.stats()
    assert (stats.graphs, stats.max_graphs, stats.captures, stats.evictions) == (2, 2, 3, 1)
    runner.run(("b",), doubled, x, 0, 1)  # captured again
    assert runner.stats().captures == 4 and runner.stats().evictions == 2
    with pytest.raises(ValueError, match="max_graphs"):
        StepRunner("emulate", 8, max_graphs=0)
    with pytest.raises(ValueError, match="max_graphs"):
        RuntimeOptions(max_graphs=0)
    assert RuntimeOptions().max_graphs == DEFAULT_MAX_GRAPHS


def test_emulated_graphs_share_one_pool_so_outputs_last_until_the_next_replay_of_any_key():
    runner = StepRunner("emulate", 8)
    a = runner.run(("a",), doubled, {"x": torch.ones(2)}, 1, 1)
    assert a["y"].tolist() == [3.0, 3.0] and a["flag"].all() and a["count"].tolist() == [3, 3]
    b = runner.run(("b",), doubled, {"x": torch.ones(3)}, 0, 1)
    assert b["y"].tolist() == [2.0, 2.0, 2.0]
    # another key's replay may have reused a's memory: emulation overwrites it with values no step produces
    assert a["y"].isnan().all() and not a["flag"].any() and (a["count"] < 0).all()
    again = runner.run(("a",), doubled, {"x": torch.ones(2)}, 1, 1)
    assert again["y"].tolist() == [3.0, 3.0] and b["y"].isnan().all()


def test_a_plain_argument_that_changes_under_one_key_is_refused():
    runner = StepRunner("emulate", 8)
    runner.run(("a",), doubled, {"x": torch.ones(2)}, 0, 1, scale=1.0)
    runner.run(("a",), doubled, {"x": torch.ones(2)}, 0, 1, scale=1.0)  # the same value: replayed
    with pytest.raises(BakedValueError, match=r"scale=2\.0 under a key captured with scale=1\.0"):
        runner.run(("a",), doubled, {"x": torch.ones(2)}, 0, 1, scale=2.0)
    with pytest.raises(BakedValueError, match="scale"):
        runner.run(("a",), doubled, {"x": torch.ones(2)}, 0, 1)  # left out: the captured value would replay
    eager = StepRunner("eager", 8)  # nothing is captured eagerly, so nothing is baked
    assert eager.run(("a",), doubled, {"x": torch.ones(2)}, 0, 1, scale=2.0)["y"].tolist() == [4.0, 4.0]


@pytest.fixture(scope="module")
def tiny_pair(processor):  # noqa: F811
    target = tiny_target(seed=0, source_positions=SOURCE_POSITIONS)
    return make_pair(target, perturbed_copy(target, 0.05, seed=1), processor)


def features(batch: int) -> torch.Tensor:
    return torch.randn(batch, 80, 2 * SOURCE_POSITIONS, generator=torch.Generator().manual_seed(batch))


def decoder(pair, graphs: str, max_graphs: int = DEFAULT_MAX_GRAPHS) -> SpeculativeDecoder:
    return SpeculativeDecoder(pair, runtime=RuntimeOptions(draft_vocab=None, cuda_graphs=graphs, max_graphs=max_graphs,
                                                           packed_weights=False))


def test_beyond_max_workspaces_the_least_recently_used_batch_size_goes(tiny_pair):
    # A server decodes batch 1 all the time and other sizes now and then: the size in use must stay, with its
    # graphs, however early it was first seen.
    dec = SpeculativeDecoder(tiny_pair, runtime=RuntimeOptions(draft_vocab=None, cuda_graphs="emulate",
                                                               max_workspaces=2, packed_weights=False))
    opts = DecodingOptions(mode="exact", gamma=2, max_new_tokens=4)
    for batch in (1, 2, 1):
        dec.decode_features(features(batch), opts)
    kept = dec._workspaces[(1, True)]
    dec.decode_features(features(3), opts)
    assert list(dec._workspaces) == [(1, True), (3, True)] and dec._workspaces[(1, True)] is kept


def test_a_pool_with_room_for_every_batch_size_captures_each_once(tiny_pair):
    # A scheduler forms batches of several sizes in turn (on an H200, six sizes through a pool of four): with
    # too little room every size comes back to new caches and a fresh capture of every step; with room for
    # them all (what the scheduler asks for, `keep_workspaces`), the second round captures nothing.
    sizes, opts = (1, 2, 4, 8, 3), DecodingOptions(mode="exact", gamma=2, max_new_tokens=4)

    def rounds(dec: SpeculativeDecoder) -> list:
        figures = []
        for _ in range(2):
            for batch in sizes:
                dec.decode_features(features(batch), opts)
            figures.append(dec.workspace_stats())
        return figures

    tight_first, tight_second = rounds(decoder(tiny_pair, "emulate"))
    assert tight_first.max_workspaces == DEFAULT_WORKSPACES < len(sizes) and RuntimeOptions().max_workspaces is None
    assert tight_second.evictions > tight_first.evictions > 0 and tight_second.captures > tight_first.captures
    roomy = decoder(tiny_pair, "emulate")
    roomy.keep_workspaces(len(sizes))
    roomy.keep_workspaces(2)  # never lowers the bound
    first, second = rounds(roomy)
    assert (first.max_workspaces, first.workspaces, first.rows) == (len(sizes), len(sizes), sum(sizes))
    assert second.evictions == 0 and second.captures == first.captures > 0
    # what a dropped workspace had captured still counts: the tight pool made every capture the roomy one did
    assert tight_first.captures == first.captures


def test_the_workspace_pool_counts_what_it_drops():
    from asr_app.decoding.steps import Workspace
    from asr_app.decoding.workspaces import WorkspacePool

    pool = WorkspacePool(2)
    runners = {}
    for key in ((1, True), (2, True), (1, True), (4, False)):  # (2, True) is the least recently used
        ws = pool.use(key) or pool.add(key, Workspace(None, None, StepRunner("emulate", 8)))
        runners[key] = ws.runner
        ws.runner.run(key, doubled, {"x": torch.ones(2)}, 0, 1)
    assert list(pool) == [(1, True), (4, False)] and len(pool) == 2
    stats = pool.stats()
    assert (stats.workspaces, stats.rows, stats.evictions, stats.captures) == (2, 5, 1, 3)
    with pytest.raises(ValueError, match="held already"):   # replacing one would lose its figures
        pool.add((1, True), Workspace(None, None, StepRunner("emulate", 8)))
    fixed = WorkspacePool(2)
    fixed.keep(12)   # a bound the user set stays
    auto = WorkspacePool()
    auto.keep(12)
    assert (fixed.max_workspaces, auto.max_workspaces) == (2, 12)
    with pytest.raises(ValueError, match="max_workspaces"):
        WorkspacePool(0)
    with pytest.raises(ValueError, match="max_workspaces"):
        RuntimeOptions(max_workspaces=0)


def test_the_generated_count_is_not_baked_into_a_graph(tiny_pair, monkeypatch):
    # The loop gives captured steps only what they depend on of the count (rules_count: 0 or 1, keyed by
    # `first`). Passing the raw count, as the loop did, would bake the capturing step's count into every replay.
    import asr_app.decoding.loop as loop

    opts = DecodingOptions(mode="exact", gamma=2, max_new_tokens=8, timestamps=True)
    decoder(tiny_pair, "emulate").decode_features(features(1), opts)
    monkeypatch.setattr(loop, "rules_count", lambda generated: generated)
    with pytest.raises(BakedValueError, match="generated="):
        decoder(tiny_pair, "emulate").decode_features(features(1), opts)


def test_a_long_mixed_run_keeps_each_workspace_within_its_bound(tiny_pair):
    # Batch sizes x modes x gammas x timestamps x temperatures, with a bound far below the keys the run makes:
    # every workspace stays within it after every decode, and dropping and recapturing graphs changes no
    # token (against eager decoding at T = 0, an unbounded emulated decoder at T > 0).
    bound = 4
    bounded, unbounded, eager = (decoder(tiny_pair, "emulate", bound), decoder(tiny_pair, "emulate", 10_000),
                                 decoder(tiny_pair, "off"))
    evictions = 0
    configs = list(itertools.product((1, 3, 2), ("exact", "off", "sigmoid", "baseline"), (1, 3), (False, True)))
    for i, (batch, mode, gamma, timestamps) in enumerate(configs[::2]):
        temperature = 0.7 if i % 5 == 4 else 0.0
        opts = DecodingOptions(mode=mode, gamma=gamma, timestamps=timestamps, temperature=temperature,
                               max_new_tokens=6)
        got = [r.tokens for r in bounded.decode_features(features(batch), opts)]
        reference = eager if temperature == 0 else unbounded
        assert got == [r.tokens for r in reference.decode_features(features(batch), opts)], (batch, mode, gamma)
        stats = [ws.runner.stats() for ws in bounded._workspaces.values()]
        assert all(s.graphs <= bound == s.max_graphs for s in stats)
        assert len(stats) <= bounded.workspace_stats().max_workspaces  # per batch size, draft or not
        evictions += sum(s.evictions for s in stats)
    assert evictions > 0  # the bound was reached, and held
    assert max(ws.runner.stats().graphs for ws in unbounded._workspaces.values()) > bound


def test_step_costs_capture_every_target_width_the_policy_can_choose(tiny_pair, monkeypatch):
    # With captured steps the cost measurement times the target step at every width (1 to MAX_GAMMA + 1), which
    # captures each one before any decode: the widths the policy picks are the widths it priced.
    from asr_app.decoding.costs import PINNED_ENV
    from asr_app.decoding.gamma import CostAwareGamma

    monkeypatch.delenv(PINNED_ENV, raising=False)
    measured = decoder(tiny_pair, "emulate")
    widths = CostAwareGamma.MAX_GAMMA + 1
    costs = measured.step_costs
    assert len(costs.widths) == widths and all(s > 0 for s in costs.widths)
    captured = sorted(key[2] for key in measured._workspaces[(1, True)].runner.captured if key[0] == "target")
    assert captured == list(range(1, widths + 1))
    assert decoder(tiny_pair, "off").step_costs.widths == ()  # eager steps: two widths timed, a linear model


@pytest.mark.parametrize("batch, mode, timestamps", [(1, "exact", False), (3, "sigmoid", True), (2, "baseline", False)])
def test_no_greedy_decode_captures_a_target_step_mid_loop(tiny_pair, batch, mode, timestamps):
    # Captured lazily, each width the policy first picks mid-decode cost that decode two warm-up calls and a
    # capture (and a Triton compile on a GPU): greedy `exact` ran slower than `off` on an H200 (docs/runtime.md).
    # So the first greedy decode of a batch size and options captures every width first. Then the target
    # steps captured for those options are exactly those widths: a width missing means the loop captured it
    # lazily; an extra key means the loop's keys and the pre-capture's differ (and the loop captured its own).
    from asr_app.decoding.gamma import CostAwareGamma, StepCosts

    widths = CostAwareGamma.MAX_GAMMA + 1
    dec = decoder(tiny_pair, "emulate")
    # GPU-like costs (a cheap draft, a flat target step): the policy drafts deep, and the length budgets cut
    # the last steps short, so the decodes meet many widths
    dec._step_costs = StepCosts(draft=0.05, target=1.0, per_token=0.0, widths=(1.0,) + (1.2,) * (widths - 1))
    eager = decoder(tiny_pair, "off")
    setups = []
    for seed, budget in ((1, 30), (2, 17), (3, 11)):
        opts = DecodingOptions(mode=mode, max_new_tokens=budget, timestamps=timestamps)
        results = dec.decode_features(features(batch) + seed, opts)
        assert [r.tokens for r in results] == [r.tokens for r in eager.decode_features(features(batch) + seed, opts)]
        st = results[0].stats
        assert st.total_s >= st.setup_s + st.encoder_s + st.draft_s + st.target_s + st.verify_s
        setups.append(st.setup_s)
    # the first decode captured every width before its loop, and its caller waited: the later ones had nothing to do
    assert setups[0] > 5 * max(setups[1:])
    dec._step_costs = StepCosts(draft=1.0, target=1.0, per_token=0.5)  # drafting never pays: width-1 steps
    assert dec.decode_features(features(batch) + 4, opts)[0].stats.drafted == 0
    suffix = (mode, opts.temperature, opts.alpha, opts.beta, timestamps)
    keys = [key for key in dec._workspaces[(batch, True)].runner.captured if key[0] == "target" and key[5:] == suffix]
    assert sorted(key[2] for key in keys) == list(range(1, widths + 1))


def test_steps_first_run_in_the_loop_count_as_setup_not_as_loop_time(tiny_pair):
    # A step captured mid-loop (a draft step of a new length, say) is one-time work: it belongs in setup_s, the
    # figure the scheduler's batch sizer and the benches leave out, and not also in the draft/target times.
    # Sampled, so no width is captured before the loop: every capture of this decode happens inside it.
    from asr_app.decoding.gamma import StepCosts

    dec = decoder(tiny_pair, "emulate")
    dec._step_costs = StepCosts(draft=0.05, target=1.0, per_token=0.0)   # pinned: no cost timing in setup
    opts = DecodingOptions(mode="exact", max_new_tokens=24, temperature=1.0, seed=5)
    first = dec.decode_features(features(2) + 7, opts)[0].stats
    runner = dec._workspaces[(2, True)].runner
    captured_s = runner.capture_s
    assert captured_s > 0 and first.setup_s >= captured_s
    assert first.total_s >= first.setup_s + first.encoder_s + first.draft_s + first.target_s + first.verify_s
    again = dec.decode_features(features(2) + 7, opts)[0].stats
    assert runner.capture_s == captured_s                   # the same shapes: nothing new to capture
    assert again.setup_s < first.setup_s / 5


def test_loop_timings_leave_out_the_time_spent_capturing():
    from asr_app.decoding.loop import Timings

    clock, captured = iter([10.0, 11.0, 14.0, 14.5]), iter([0.0, 0.0, 2.5, 2.5])
    timings = Timings(captured=lambda: next(captured), clock=lambda: next(clock))
    assert timings.lap() == 1.0          # no capture in this lap
    assert timings.lap() == 0.5          # 3 s, 2.5 of them capturing
    assert timings.lap() == 0.5


def test_step_costs_use_the_timed_width_where_there_is_one():
    from asr_app.decoding.gamma import StepCosts

    table = StepCosts(draft=0.1, target=1.0, per_token=0.1, widths=(1.0, 1.5))
    assert table.step(1) == pytest.approx(0.1 + 1.5)
    assert table.step(3) == pytest.approx(0.3 + 1.0 + 0.3)  # past the table: linear
    assert StepCosts(draft=0.1, target=1.0, per_token=0.1).step(1) == pytest.approx(0.1 + 1.0 + 0.1)
