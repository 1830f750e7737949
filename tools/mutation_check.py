"""Mutation check of the tests on the decoding loop, Whisper's rules and the verification kernels (issue 31).

Each mutant is one explicit edit: (file, original snippet, mutated snippet, description), the original
occurring exactly once in the file. Every mutant runs against the tests that cover its file (a named test
set below, in the order most likely to fail first), with ``-x``: a failing test kills it.

The mutants are applied to a COPY of the package and its tests (``--copy``, made fresh from the repository
here), never to the working tree: the tests import the copy (it comes first on ``sys.path``; every run
records the ``__file__`` of the mutated module and the runner refuses a run that imported anything else).

To keep the run short on a small machine, one parent process imports torch, transformers, scipy and triton
once (never ``asr_app``) and forks a child per mutant; the child imports ``asr_app`` afresh from the copy
(no bytecode is written or read for it) and runs ``pytest.main``. Afterwards the tests that killed a mutant
run once on the unmutated copy (a kill by a test that fails anyway would not count), and, time allowing,
every survivor runs against the whole test files of its set (no ``-x``: are there tests outside the
short set that kill it?).

    nice -n 19 python tools/mutation_check.py --deadline 14:40 \
        --out bench/results/cpu/<date>/mutation_check.json
    python tools/mutation_check.py --list          # the mutants, checked against the sources; runs nothing
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str          # relative to the repository root
    original: str      # occurs exactly once in the file
    mutated: str
    description: str
    tests: str         # key of TEST_SETS


# ------------------------------------------------------------------------------------------- test sets
# Ordered: cheap tests that exercise the file most directly first (-x stops at the first failure).
_TILING = "tests/test_kernels_identity.py::test_exact_and_sigmoid_agree_for_any_tiling"
_ZERO = "tests/test_kernels_identity.py::test_zero_drafts_gives_one_token_from_the_target"
_PADDING = "tests/test_kernels_api.py::test_unused_draft_slots_may_hold_padding"
_CPU_STREAM = "tests/test_kernels_identity.py::test_verify_on_cpu_uses_the_torch_reference_with_the_generator_stream"


def _grid(test: str, cases: tuple[str, ...] = ("B3-g5-V37-float32", "B1-g1-V37-float16", "B3-g20-V51866-float32")
          ) -> list[str]:
    return [f"tests/test_kernels_identity.py::{test}[{case}]" for case in cases]


TEST_SETS: dict[str, list[str]] = {
    "exact": [
        _TILING, *_grid("test_exact_triton_matches_torch"), _ZERO,
        "tests/test_kernels_distribution.py::test_exact_first_token_follows_target",
        "tests/test_kernels_distribution.py::test_exact_chi_square_detects_a_wrong_distribution",
        "tests/test_kernels_identity.py::test_sampling_kernels_with_default_parameters_bf16_temperature_and_strided_input[exact]",
        "tests/test_kernels_identity.py::test_draft_logits_in_their_own_dtype_and_one_hot_drafts[exact]",
        "tests/test_kernels_api.py::test_greedy_verification_reproduces_the_target_argmax_path[exact-t0]",
        _PADDING, _CPU_STREAM,
    ],
    "sigmoid": [
        _TILING, *_grid("test_sigmoid_triton_matches_torch"), _ZERO,
        "tests/test_kernels_distribution.py::test_sigmoid_matches_its_closed_form_and_records_tv",
        "tests/test_kernels_distribution.py::test_sigmoid_residual_stays_on_the_ids_a_reduced_draft_head_scores",
        "tests/test_kernels_distribution.py::test_sigmoid_token_after_accepted_drafts_follows_the_target_softmax",
        "tests/test_kernels_identity.py::test_sampling_kernels_with_default_parameters_bf16_temperature_and_strided_input[sigmoid]",
        "tests/test_kernels_identity.py::test_draft_logits_in_their_own_dtype_and_one_hot_drafts[sigmoid]",
        "tests/test_kernels_api.py::test_greedy_verification_reproduces_the_target_argmax_path[sigmoid-t0]",
        _PADDING, _CPU_STREAM,
    ],
    "sampling": [  # kernels/sampling.py: the Triton draw shared by exact and sigmoid
        _TILING, *_grid("test_exact_triton_matches_torch"), *_grid("test_sigmoid_triton_matches_torch"), _ZERO,
        "tests/test_kernels_identity.py::test_sampling_kernels_with_default_parameters_bf16_temperature_and_strided_input",
        "tests/test_kernels_identity.py::test_draft_logits_in_their_own_dtype_and_one_hot_drafts",
    ],
    "greedy": [
        _TILING, *_grid("test_greedy_triton_matches_torch"), _ZERO,
        "tests/test_kernels_identity.py::test_greedy_ties_go_to_the_lowest_id",
        "tests/test_kernels_api.py::test_greedy_verification_reproduces_the_target_argmax_path",
        _PADDING,
    ],
    "baseline": [
        "tests/test_kernels_api.py::test_baseline_equals_transformers_speculative_sampling",
        "tests/test_kernels_distribution.py::test_baseline_first_token_follows_target",
        _PADDING,
    ],
    "rules": [
        "tests/test_decoding_rules.py::test_rules_match_transformers_at_every_position",
        "tests/test_decoding_greedy.py::test_greedy_identity_tiny_random",
        "tests/test_decoding_greedy.py::test_greedy_identity_real_tiny_en[True]",
    ],
    "loop": [  # decoding/loop.py and decoding/steps.py
        "tests/test_decoding_greedy.py::test_greedy_identity_tiny_random",
        "tests/test_decoding_greedy.py::test_stats_and_profiled_verify",
        "tests/test_decoding_greedy.py::test_batch_of_three_equals_each_alone",
        "tests/test_decoding_greedy.py::test_prompt_and_no_speech",
        "tests/test_decoding_hints.py::test_greedy_tokens_do_not_depend_on_the_hint[exact]",
        "tests/test_decoding_hints.py::test_hints_in_a_batch_and_errors",
        "tests/test_decoding_hints.py::test_sampling_with_a_hint_keeps_the_target_distribution[exact]",
        "tests/test_decoding_sampling.py::test_first_token_distribution_matches_target_only[exact]",
        "tests/test_decoding_sampling.py::test_seeded_sampling_gives_valid_transcripts",
        "tests/test_decoding_greedy.py::test_greedy_identity_real_tiny_en[True]",
    ],
}
# Seconds a mutant's run may take (a run past it is "timeout": undecided, not counted as killed).
SET_TIMEOUT = {"exact": 150, "sigmoid": 150, "sampling": 150, "greedy": 150, "baseline": 150, "rules": 240,
               "loop": 360, "steps": 360}

# The whole files behind each set (the survivors' second pass).
FULL_FILES: dict[str, list[str]] = {
    "exact": ["tests/test_kernels_identity.py", "tests/test_kernels_distribution.py", "tests/test_kernels_api.py"],
    "sigmoid": ["tests/test_kernels_identity.py", "tests/test_kernels_distribution.py", "tests/test_kernels_api.py"],
    "sampling": ["tests/test_kernels_identity.py"],
    "greedy": ["tests/test_kernels_identity.py", "tests/test_kernels_api.py"],
    "baseline": ["tests/test_kernels_api.py", "tests/test_kernels_distribution.py"],
    "rules": ["tests/test_decoding_rules.py", "tests/test_decoding_greedy.py", "tests/test_learned_costs.py"],
    "loop": ["tests/test_decoding_greedy.py", "tests/test_decoding_hints.py", "tests/test_decoding_sampling.py",
             "tests/test_learned_costs.py"],
}

# ------------------------------------------------------------------------------------------- mutants
K, D = "asr_app/kernels/", "asr_app/decoding/"
EXACT, SIGMOID, SAMPLING, GREEDY, BASELINE = (K + n for n in ("exact.py", "sigmoid.py", "sampling.py", "greedy.py",
                                                              "baseline.py"))
RULES, LOOP, STEPS = D + "rules.py", D + "loop.py", D + "steps.py"

MUTANTS: list[Mutant] = [
    # --- kernels/exact.py: PyTorch reference
    Mutant("exact-accept-flip", EXACT, "accept = (u[:, :gamma] * q_x.double() < p_x.double())",
           "accept = (u[:, :gamma] * q_x.double() > p_x.double())", "torch: acceptance comparison flipped", "exact"),
    Mutant("exact-accept-swap-pq", EXACT, "accept = (u[:, :gamma] * q_x.double() < p_x.double())",
           "accept = (u[:, :gamma] * p_x.double() < q_x.double())", "torch: p and q swapped in acceptance", "exact"),
    Mutant("exact-resid-swap-pq", EXACT, "(p_n - q_n).clamp_min(0.0)", "(q_n - p_n).clamp_min(0.0)",
           "torch: residual max(0, q - p) instead of max(0, p - q)", "exact"),
    Mutant("exact-resid-no-clamp", EXACT, "(p_n - q_n).clamp_min(0.0)", "(p_n - q_n)",
           "torch: residual without max(0, .)", "exact"),
    Mutant("exact-rejected-off-by-one", EXACT, "    rejected = n < nd\n\n    # The one row",
           "    rejected = n <= nd\n\n    # The one row", "torch: a row that accepted every draft counts as rejected",
           "exact"),
    Mutant("exact-drop-ragged-mask", EXACT, "p_x.double()) & draft_valid_mask(nd, gamma)", "p_x.double())",
           "torch: drafts past num_draft may be accepted (ragged mask dropped)", "exact"),
    Mutant("exact-triton-accept-swap-pq", EXACT, "accept = (u * q_x.to(tl.float64) < p_x.to(tl.float64)) & drafted",
           "accept = (u * p_x.to(tl.float64) < q_x.to(tl.float64)) & drafted",
           "triton: p and q swapped in acceptance", "exact"),
    Mutant("exact-triton-target-rows-off-by-one", EXACT, "t_limit = tl.where(c <= nd, vocab, 0)",
           "t_limit = tl.where(c < nd, vocab, 0)", "triton: the target row after the last draft is not read", "exact"),
    Mutant("exact-triton-target-live-off-by-one", EXACT, "t_live = (rows <= nd)[:, None] & split_live",
           "t_live = (rows < nd)[:, None] & split_live",
           "triton: the log-sum-exp of the row after the last draft is not combined", "exact"),
    Mutant("exact-triton-lse-row-off-by-one", EXACT, "lse_t_n = tl.sum(tl.where(rows == n, lse_t, 0.0), axis=0)",
           "lse_t_n = tl.sum(tl.where(rows == n + 1, lse_t, 0.0), axis=0)",
           "triton: the sampled row normalised by the next row's log-sum-exp", "exact"),
    Mutant("exact-triton-combine-sign", EXACT, "total = tl.sum(s * tl.exp(m - m_safe[:, None]), axis=1)",
           "total = tl.sum(s * tl.exp(m_safe[:, None] - m), axis=1)",
           "triton: per-split partials rescaled with the wrong sign", "exact"),
    # --- kernels/sampling.py: the Triton draw shared by exact and sigmoid
    Mutant("sampling-rejected-off-by-one", SAMPLING, "    rejected = n < nd\n", "    rejected = n <= nd\n",
           "finalize: every row treated as rejected", "sampling"),
    Mutant("sampling-resid-swap-pq", SAMPLING, "resid = tl.maximum(p - tl.exp(zd - lse_d), 0.0)",
           "resid = tl.maximum(tl.exp(zd - lse_d) - p, 0.0)", "exact residual max(0, q - p)", "sampling"),
    Mutant("sampling-sigmoid-resid-unrestricted", SAMPLING,
           "return tl.where(zd > float(\"-inf\"), tl.maximum(p_hat - q_hat, 0.0), 0.0)",
           "return tl.maximum(p_hat - q_hat, 0.0)",
           "sigmoid residual not restricted to the ids the draft scores", "sampling"),
    Mutant("sampling-use-resid-ge", SAMPLING, "use_resid = tl.sum(resid_mass, axis=0) > 0",
           "use_resid = tl.sum(resid_mass, axis=0) >= 0", "an empty residual no longer falls back to p", "sampling"),
    Mutant("sampling-uniform-off-by-one", SAMPLING, "threshold = tl.load(uniforms_ptr + b * (gamma + 1) + gamma)",
           "threshold = tl.load(uniforms_ptr + b * (gamma + 1) + gamma - 1)",
           "the draw uses the last draft's uniform, not its own", "sampling"),
    Mutant("sampling-last-id-never-drawn", SAMPLING,
           "zt = tl.load(t_row + idx, mask=idx < vocab, other=float(\"-inf\"))",
           "zt = tl.load(t_row + idx, mask=idx < vocab - 1, other=float(\"-inf\"))",
           "off by one: the vocabulary's last id is never drawn", "sampling"),
    Mutant("sampling-online-lse-no-rescale", SAMPLING, "s = s * tl.exp(m - m_safe) + tl.sum",
           "s = s + tl.sum", "online log-sum-exp does not rescale the running sum", "sampling"),
    Mutant("sampling-sigmoid-split-mass-sign", SAMPLING, "p_mass = p_mass * tl.exp(m - lse_t).to(tl.float64)",
           "p_mass = p_mass * tl.exp(lse_t - m).to(tl.float64)",
           "sigmoid: per-split softmax masses with the wrong sign", "sampling"),
    # --- kernels/sigmoid.py
    Mutant("sigmoid-accept-swap-pq", SIGMOID, "accept = (u[:, :gamma] * q_x.double() < p_x.double())",
           "accept = (u[:, :gamma] * p_x.double() < q_x.double())", "torch: p_hat and q_hat swapped in acceptance",
           "sigmoid"),
    Mutant("sigmoid-weights-sign", SIGMOID, "return torch.sigmoid((z - alpha) * (1.0 / (beta - alpha)))",
           "return torch.sigmoid((z - alpha) * (1.0 / (alpha - beta)))",
           "torch: sigmoid weights with the width's sign flipped", "sigmoid"),
    Mutant("sigmoid-resid-unrestricted", SIGMOID, "return torch.where(torch.isneginf(zd), 0.0, resid)",
           "return resid", "torch: residual not restricted to the ids the draft scores", "sigmoid"),
    Mutant("sigmoid-resid-swap-pq", SIGMOID,
           "resid = (zt - alpha).mul_(inv_width).sigmoid_()\n    resid.sub_((zd - alpha)",
           "resid = (zd - alpha).mul_(inv_width).sigmoid_()\n    resid.sub_((zt - alpha)",
           "torch: residual max(0, q_hat - p_hat)", "sigmoid"),
    Mutant("sigmoid-use-resid-drop-rejected", SIGMOID, "use_resid = rejected & (resid.sum(",
           "use_resid = (resid.sum(", "torch: the residual also after every draft was accepted", "sigmoid"),
    Mutant("sigmoid-bonus-row-off-by-one", SIGMOID, "zt_n = _scaled_copy(_row_at(target_logits, n), inv_temperature)",
           "zt_n = _scaled_copy(_row_at(target_logits, n.clamp(max=max(gamma - 1, 0))), inv_temperature)",
           "torch: the token after the accepted drafts read from the row before", "sigmoid"),
    Mutant("sigmoid-triton-accept-flip", SIGMOID,
           "accept = (u * q_x.to(tl.float64) < p_x.to(tl.float64)) & drafted",
           "accept = (u * q_x.to(tl.float64) > p_x.to(tl.float64)) & drafted",
           "triton: acceptance comparison flipped", "sigmoid"),
    Mutant("sigmoid-triton-drop-ragged", SIGMOID,
           "accept = (u * q_x.to(tl.float64) < p_x.to(tl.float64)) & drafted",
           "accept = (u * q_x.to(tl.float64) < p_x.to(tl.float64))",
           "triton: drafts past num_draft may be accepted", "sigmoid"),
    # --- kernels/greedy.py
    Mutant("greedy-match-flip", GREEDY, "match = (draft_tokens[:, :gamma] == target_argmax[:, :gamma])",
           "match = (draft_tokens[:, :gamma] != target_argmax[:, :gamma])", "torch: accept on mismatch", "greedy"),
    Mutant("greedy-drop-ragged", GREEDY, "target_argmax[:, :gamma]) & draft_valid_mask(nd, gamma)",
           "target_argmax[:, :gamma])", "torch: drafts past num_draft may be accepted", "greedy"),
    Mutant("greedy-next-token-off-by-one", GREEDY,
           "next_token = target_argmax[torch.arange(batch, device=target_logits.device), n]",
           "next_token = target_argmax[torch.arange(batch, device=target_logits.device), (n - 1).clamp(min=0)]",
           "torch: the next token from the row before the first mismatch", "greedy"),
    Mutant("greedy-triton-ties-later-tile", GREEDY, "better = tile_max > best_val", "better = tile_max >= best_val",
           "triton: a later tile wins ties (not the lowest id)", "greedy"),
    Mutant("greedy-triton-bonus-row-unread", GREEDY,
           "live = (rows <= nd)[:, None] & (splits < num_splits)[None, :]",
           "live = (rows < nd)[:, None] & (splits < num_splits)[None, :]",
           "triton: the row after the last draft is not read", "greedy"),
    Mutant("greedy-triton-split-ties-max", GREEDY,
           "row_arg = tl.min(tl.where(vals == row_max[:, None], idxs, 2147483647), axis=1)",
           "row_arg = tl.max(tl.where(vals == row_max[:, None], idxs, -1), axis=1)",
           "triton: ties across splits go to the highest id", "greedy"),
    # --- kernels/baseline.py
    Mutant("baseline-accept-flip", BASELINE, "is_accepted = (r_i <= probability_ratio)",
           "is_accepted = (r_i >= probability_ratio)", "acceptance comparison flipped", "baseline"),
    Mutant("baseline-ratio-swap-pq", BASELINE, "probability_ratio = p_i / q_i", "probability_ratio = q_i / p_i",
           "p and q swapped in the acceptance ratio", "baseline"),
    Mutant("baseline-resid-swap-pq", BASELINE, "torch.clamp(p_next - q[rows_b,", "torch.clamp(-p_next + q[rows_b,",
           "residual max(0, q - p)", "baseline"),
    Mutant("baseline-resid-on-accepted-rows", BASELINE,
           "p_prime = torch.where(rejected[:, None] & (total > 0), normalised, p_next)",
           "p_prime = torch.where(total > 0, normalised, p_next)",
           "a row that accepted every draft draws from a residual when another row was rejected", "baseline"),
    Mutant("baseline-bonus-row-dropped", BASELINE, "target_logits[:, : used + 1]", "target_logits[:, :used]",
           "off by one: p computed without the row after the last draft", "baseline"),
    # --- decoding/rules.py
    Mutant("rules-begin-suppress-flip", RULES, "if first_generated == 0:", "if first_generated != 0:",
           "blank/EOS suppressed at every position but the first", "rules"),
    Mutant("rules-drop-suppress-tokens", RULES, "return logits + bias", "return logits.clone()",
           "suppress_tokens rule dropped", "rules"),
    Mutant("rules-timestamp-begin-off-by-one", RULES, "is_ts = token >= timestamp_begin",
           "is_ts = token > timestamp_begin", "off by one: <|0.00|> not counted as a timestamp", "rules"),
    Mutant("rules-penultimate-off-by-one", RULES, "if self.generated >= 1 else", "if self.generated > 1 else",
           "off by one: the first generated token is not the penultimate one", "rules"),
    Mutant("rules-timestamps-may-repeat", RULES, "torch.where(pair_open, states.last_ts, states.last_ts + 1)",
           "torch.where(pair_open, states.last_ts, states.last_ts)",
           "a new timestamp may repeat the last closed one", "rules"),
    Mutant("rules-drop-pair-open", RULES, "        out[..., : self.eos].masked_fill_(pair_open[..., None], NEG_INF)\n",
           "", "rule dropped: after an open timestamp, text is allowed", "rules"),
    Mutant("rules-max-initial-off-by-one", RULES, "out[:, :1, tb + self.max_initial + 1 :] = NEG_INF",
           "out[:, :1, tb + self.max_initial :] = NEG_INF", "off by one in max_initial_timestamp", "rules"),
    Mutant("rules-timestamps-win-flip", RULES, "out[..., :tb].masked_fill_((ts_mass > best_text)[..., None], NEG_INF)",
           "out[..., :tb].masked_fill_((ts_mass < best_text)[..., None], NEG_INF)",
           "the timestamps-win rule flipped", "rules"),
    Mutant("rules-notimestamps-allowed", RULES, "            self.suppress.extend(gc.no_timestamps_token_id)\n",
           "            pass\n", "rule dropped: <|notimestamps|> allowed with timestamps", "rules"),
    # --- decoding/loop.py
    Mutant("loop-common-max", LOOP, "common = min(int(host[i][gamma + 1]) for i in active)",
           "common = max(int(host[i][gamma + 1]) for i in active)",
           "a batch keeps the largest acceptance, not the smallest", "loop"),
    Mutant("loop-target-cache-off-by-one", LOOP, "ws.target.rollback(length + common)",
           "ws.target.rollback(length + common + 1)", "off by one in the target's cache length after a step",
           "loop"),
    Mutant("loop-draft-cache-off-by-one", LOOP, "ws.draft.rollback(length + common - self.draft_skip)",
           "ws.draft.rollback(length + common - self.draft_skip + 1)",
           "off by one in the draft's cache length after a step", "loop"),
    Mutant("loop-draft-rollback-never", LOOP, "ws.draft.length > length + common - self.draft_skip:",
           "ws.draft.length < length + common - self.draft_skip:",
           "the draft's cache keeps its rejected proposals", "loop"),
    Mutant("loop-draft-ids-off-by-one", LOOP, "ids, state = b.history[:, self.draft_skip + ws.draft.length:]",
           "ids, state = b.history[:, self.draft_skip + ws.draft.length + 1:]",
           "off by one: the draft skips the pending token", "loop"),
    Mutant("loop-stats-hint-as-draft", LOOP, "st.accepted += min(accepted, p.drafted)", "st.accepted += accepted",
           "hinted tokens counted as accepted drafts", "loop"),
    Mutant("loop-budget-off-by-one", LOOP, "budget = self.max_len - b.generated - 1",
           "budget = self.max_len - b.generated", "off by one in the drafting budget (max_new_tokens)", "loop"),
    Mutant("loop-hint-follows-flip", LOOP, "return all(hints[i][:1] == [drafted[i]] for i in b.active)",
           "return all(hints[i][:1] != [drafted[i]] for i in b.active)",
           "drafting stops early when the hint disagrees", "loop"),
    Mutant("loop-eos-keeps-eos-off", LOOP, "tokens = tokens[: tokens.index(self.eos) + 1]",
           "tokens = tokens[: tokens.index(self.eos)]", "off by one: a row's EOS is cut, the row never ends",
           "loop"),
    Mutant("loop-hint-one-hot-wrong-id", LOOP, "scatter_(-1, hint[..., None], 0.0)",
           "scatter_(-1, (hint[..., None] + 1) % vocab, 0.0)", "a hint's q one-hot on the wrong id", "loop"),
    # --- decoding/steps.py
    Mutant("steps-draft-temperature-inverted", STEPS, "probs = torch.softmax(logits.float() / temperature, dim=-1)",
           "probs = torch.softmax(logits.float() * temperature, dim=-1)",
           "the draft samples from softmax(z * T), not the q verification assumes", "steps"),
    Mutant("steps-rules-count-zero", STEPS, "return min(generated, 1)", "return min(generated, 0)",
           "every step's rules think nothing was generated yet", "steps"),
    Mutant("steps-no-speech-wrong-id", STEPS, "dim=-1)[:, no_speech_id]", "dim=-1)[:, no_speech_id - 1]",
           "P(<|nospeech|>) read at the wrong id", "steps"),
    Mutant("steps-first-step-rules-state", STEPS, "rule_state(0, last_is_ts, penult_is_ts, last_ts)",
           "rule_state(1, last_is_ts, penult_is_ts, last_ts)",
           "the prompt's step scored without the first-token rules", "steps"),
    Mutant("steps-logprobs-softmax", STEPS, "target_logits.float().log_softmax(dim=-1)",
           "target_logits.float().softmax(dim=-1)", "log-probabilities replaced by probabilities", "steps"),
]
for _key in ("steps",):  # decoding/steps.py is covered by the loop's tests
    TEST_SETS[_key], FULL_FILES[_key] = TEST_SETS["loop"], FULL_FILES["loop"]


# ------------------------------------------------------------------------------------------- the copy
def make_copy(dest: Path) -> None:
    """asr_app, tests and pyproject.toml copied to `dest` (no bytecode)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in ("asr_app", "tests"):
        shutil.copytree(REPO / name, dest / name, ignore=ignore)
    shutil.copy2(REPO / "pyproject.toml", dest / "pyproject.toml")


def check_mutants(root: Path) -> list[str]:
    """Problems: an original snippet missing or not unique, a mutant that changes nothing, duplicate ids."""
    problems, seen = [], set()
    for m in MUTANTS:
        if m.id in seen:
            problems.append(f"{m.id}: duplicate id")
        seen.add(m.id)
        text = (root / m.file).read_text()
        count = text.count(m.original)
        if count != 1:
            problems.append(f"{m.id}: original found {count} times in {m.file}")
        if m.original == m.mutated:
            problems.append(f"{m.id}: mutated == original")
        if m.tests not in TEST_SETS:
            problems.append(f"{m.id}: unknown test set {m.tests}")
    return problems


# ------------------------------------------------------------------------------------------- running
@dataclass
class Outcome:
    id: str
    file: str
    description: str
    tests: str
    status: str                       # killed | survived | timeout | error
    seconds: float
    killed_by: str | None = None
    message: str | None = None
    imported_from: str | None = None
    full_files_status: str | None = None   # survivors: the whole files of the set, no -x
    notes: list[str] = field(default_factory=list)


class _Recorder:
    """pytest plugin: the first failing test and its one-line reason."""

    def __init__(self) -> None:
        self.failed: str | None = None
        self.message: str | None = None
        self.failures: list[str] = []
        self.passed = 0

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed:
            self.failures.append(report.nodeid)
        if report.failed and self.failed is None:
            self.failed = report.nodeid
            crash = getattr(report.longrepr, "reprcrash", None)
            self.message = (crash.message if crash is not None else str(report.longrepr))[:300]
        elif report.passed and report.when == "call":
            self.passed += 1


def _child(copy: Path, module: str | None, args: list[str], result_file: Path, log_file: Path) -> None:
    """In the forked child: run pytest on the copy, write what happened, exit."""
    code = 3
    try:
        fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(copy)
        sys.path.insert(0, str(copy))
        import importlib

        import pytest

        package = importlib.import_module("asr_app")
        if not Path(package.__file__).resolve().is_relative_to(copy.resolve()):
            raise RuntimeError(f"asr_app imported from {package.__file__}, not from the copy {copy}")
        recorder = _Recorder()
        code = int(pytest.main(["-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=", *args], plugins=[recorder]))
        mod = sys.modules.get(module) if module else None
        result = {"code": code, "failed": recorder.failed, "message": recorder.message, "passed": recorder.passed,
                  "failures": recorder.failures,
                  "imported_from": getattr(mod, "__file__", None), "package": package.__file__}
        result_file.write_text(json.dumps(result))
    except BaseException as exc:  # noqa: BLE001 - report anything to the parent
        result_file.write_text(json.dumps({"code": 99, "failed": None, "message": repr(exc)[:300]}))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if code in (0, 1) else 3)


def run_pytest(copy: Path, args: list[str], module: str | None, timeout: float, logs: Path, name: str,
               no_x: bool = False) -> tuple[dict, float, bool]:
    """(child's result, seconds, timed out) of one pytest run in a forked child."""
    result_file, log_file = logs / f"{name}.json", logs / f"{name}.log"
    result_file.unlink(missing_ok=True)
    if no_x:
        args = ["--maxfail=1000000", *args]  # overrides -x's maxfail=1
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(copy, module, args, result_file, log_file)
    timed_out = False
    while True:
        done, _status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - start > timeout:
            os.kill(pid, signal.SIGKILL)  # our own child
            os.waitpid(pid, 0)
            timed_out = True
            break
        time.sleep(0.2)
    seconds = time.monotonic() - start
    result = json.loads(result_file.read_text()) if result_file.exists() else {"code": None}
    return result, seconds, timed_out


def module_name(path: str) -> str:
    return path[:-3].replace("/", ".")


def run_mutant(m: Mutant, copy: Path, timeout: float, logs: Path, tests: list[str] | None = None,
               tag: str = "") -> Outcome:
    """Apply `m` to the copy, run `tests` (default: its set) with -x, restore the file."""
    target = copy / m.file
    original = target.read_text()
    assert original.count(m.original) == 1, m.id
    target.write_text(original.replace(m.original, m.mutated))
    try:
        result, seconds, timed_out = run_pytest(copy, tests or TEST_SETS[m.tests], module_name(m.file), timeout,
                                                logs, m.id + tag)
    finally:
        target.write_text(original)
    out = Outcome(m.id, m.file, m.description, m.tests, "error", round(seconds, 1),
                  imported_from=result.get("imported_from"))
    if timed_out:
        out.status = "timeout"
    elif result.get("code") == 1:
        out.status, out.killed_by, out.message = "killed", result.get("failed"), result.get("message")
    elif result.get("code") == 0:
        out.status = "survived"
    else:
        out.message = result.get("message") or f"pytest exit code {result.get('code')} (see the log)"
    if out.imported_from and not Path(out.imported_from).resolve().is_relative_to(copy.resolve()):
        out.status, out.notes = "error", [f"mutated module imported from {out.imported_from}"]
    return out


def interleaved(mutants: list[Mutant]) -> list[Mutant]:
    """Round-robin over the files, so that a run cut short by its deadline still covers every file."""
    by_file: dict[str, list[Mutant]] = {}
    for m in mutants:
        by_file.setdefault(m.file, []).append(m)
    queues, order = list(by_file.values()), []
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop(0))
    return order


def parse_deadline(text: str | None) -> float | None:
    """Seconds from now until HH:MM UTC today (or a number of seconds)."""
    if text is None:
        return None
    if ":" not in text:
        return float(text)
    hour, minute = (int(v) for v in text.split(":"))
    now = dt.datetime.now(dt.UTC)
    return (now.replace(hour=hour, minute=minute, second=0, microsecond=0) - now).total_seconds()


UNCONFIRMED = "its killing test was not seen passing unmutated"


def write_summary(opts, argv, outcomes: list[Outcome], not_run: list[str], baseline: dict, final: bool) -> None:
    """The result JSON (rewritten after every mutant, so a run cut short still leaves its figures)."""
    killed = [o for o in outcomes if o.status == "killed" and UNCONFIRMED not in o.notes]
    survivors = [o for o in outcomes if o.status == "survived"]
    gap_killed = [o for o in survivors if any(n.startswith("gap tests: killed") for n in o.notes)]

    def share(count: int) -> float | None:
        return round(count / len(outcomes), 4) if outcomes else None

    summary = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "finished": final,
        "command": "nice -n 19 python tools/mutation_check.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "mutants_defined": len(MUTANTS), "mutants_run": len(outcomes), "not_run": not_run,
        "killed": len(killed), "share_killed": share(len(killed)),
        "share_killed_with_gap_tests": share(len(killed) + len(gap_killed)),
        "survived": [o.id for o in survivors],
        "timeouts_undecided": [o.id for o in outcomes if o.status == "timeout"],
        "errors": [o.id for o in outcomes if o.status == "error"],
        "per_file": {f: {"run": sum(o.file == f for o in outcomes), "killed": sum(o.file == f for o in killed)}
                     for f in sorted({m.file for m in MUTANTS})},
        "baseline_of_killing_tests": baseline,
        "test_sets": TEST_SETS,
        "outcomes": [asdict(o) for o in outcomes],
        "mutants": [asdict(m) for m in MUTANTS],
    }
    if opts.out:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(summary, indent=1) + "\n")
    if final:
        print(f"{len(killed)}/{len(outcomes)} killed ({summary['share_killed']}); survived: {summary['survived']}; "
              f"undecided: {summary['timeouts_undecided']}; errors: {summary['errors']}; not run: {not_run}",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copy", type=Path, default=Path("/tmp/asr-mutation/copy"), help="where the copy is made")
    ap.add_argument("--logs", type=Path, default=Path("/tmp/asr-mutation/logs"))
    ap.add_argument("--out", type=Path, help="result JSON")
    ap.add_argument("--only", nargs="*", help="mutant ids to run (default: all)")
    ap.add_argument("--timeout-scale", type=float, default=1.0, help="multiplies SET_TIMEOUT")
    ap.add_argument("--deadline", help="HH:MM UTC (or seconds from now): no run starts that could end after it")
    ap.add_argument("--reserve", type=float, default=240.0,
                    help="seconds before the deadline kept for the unmutated re-run of the killing tests")
    ap.add_argument("--gap-tests", nargs="*", default=[],
                    help="tests added after the main pass: survivors are re-run against them alone")
    ap.add_argument("--no-full", action="store_true", help="skip the survivors' pass over the whole files")
    ap.add_argument("--last", nargs="*", help="mutant ids to run after all the others")
    ap.add_argument("--list", action="store_true", help="check and list the mutants; run nothing")
    opts = ap.parse_args(argv)

    problems = check_mutants(REPO)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    chosen = interleaved([m for m in MUTANTS if not opts.only or m.id in opts.only])
    # the kernels' and the rules' mutants take seconds, the loop's minutes: run the cheap ones first, then
    # those named by --last at the very end
    chosen.sort(key=lambda m: (m.tests in ("loop", "steps"), m.id in (opts.last or [])))
    if opts.list:
        for m in chosen:
            print(f"{m.id:40s} {m.file:32s} [{m.tests}] {m.description}")
        print(f"{len(chosen)} mutants")
        return 0
    remaining = parse_deadline(opts.deadline)
    end = time.monotonic() + remaining if remaining is not None else float("inf")

    def fits(seconds: float, reserve: float = 0.0) -> bool:
        return time.monotonic() + seconds + reserve <= end

    def timeout_of(m: Mutant) -> float:
        return SET_TIMEOUT[m.tests] * opts.timeout_scale

    # The environment conftest would set, before the heavy imports the children inherit.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("ASR_APP_TEST_MODELS", str(REPO / ".cache" / "test-models"))
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    sys.dont_write_bytecode = True  # the children compile the copy's sources, never a stale .pyc
    make_copy(opts.copy)
    opts.logs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    import numpy  # noqa: F401
    import pytest  # noqa: F401
    import scipy.stats  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import transformers.generation.utils  # noqa: F401
    import transformers.models.whisper.modeling_whisper  # noqa: F401
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    assert "asr_app" not in sys.modules, "the parent must not import asr_app (the children import the copy's)"
    print(f"imports {time.monotonic() - t0:.1f} s; copy at {opts.copy}", flush=True)

    # 1. every mutant against its test set, -x
    outcomes: list[Outcome] = []
    not_run: list[str] = []
    baseline: dict = {}
    for m in chosen:
        if not fits(timeout_of(m), opts.reserve):
            not_run.append(m.id)
            continue
        out = run_mutant(m, opts.copy, timeout_of(m), opts.logs)
        outcomes.append(out)
        print(f"{out.status:8s} {out.seconds:6.1f}s {m.id:40s} {out.killed_by or ''} {out.message or ''}"[:260],
              flush=True)
        write_summary(opts, argv, outcomes, not_run, baseline, final=False)

    # 2. the tests that killed a mutant (and the gap tests), unmutated: they must pass
    killers = sorted({o.killed_by for o in outcomes if o.status == "killed" and o.killed_by})
    baseline["tests"] = killers + opts.gap_tests
    if baseline["tests"] and fits(opts.reserve):
        result, seconds, timed_out = run_pytest(opts.copy, baseline["tests"], None, opts.reserve, opts.logs,
                                                "baseline", no_x=True)
        baseline.update(code=result.get("code"), passed=result.get("passed"), failures=result.get("failures"),
                        seconds=round(seconds, 1), timed_out=timed_out)
        print(f"baseline (killing tests unmutated): code {result.get('code')}, {result.get('passed')} passed, "
              f"failures {result.get('failures')} in {seconds:.0f} s", flush=True)
        for o in outcomes:
            if o.status == "killed" and (o.killed_by in (result.get("failures") or []) or timed_out):
                o.notes.append(UNCONFIRMED)
    elif baseline["tests"]:
        baseline["skipped"] = "no time left"

    # 3. survivors against the gap tests (tests/test_mutation_gaps.py), then against the whole files
    survivors = [o for o in outcomes if o.status == "survived"]
    gap_ok = opts.gap_tests and baseline.get("code") == 0
    for o in survivors:
        m = next(x for x in MUTANTS if x.id == o.id)
        if gap_ok and fits(90):
            g = run_mutant(m, opts.copy, 90, opts.logs, opts.gap_tests, "-gaps")
            o.notes.append(f"gap tests: {g.status}" + (f" by {g.killed_by}" if g.killed_by else ""))
            print(f"gap tests {m.id}: {g.status} {g.killed_by or ''}", flush=True)
            write_summary(opts, argv, outcomes, not_run, baseline, final=False)
    for o in survivors:
        if opts.no_full:
            break
        m = next(x for x in MUTANTS if x.id == o.id)
        if not fits(2 * timeout_of(m)):
            o.full_files_status = "not run (no time left)"
            continue
        f = run_mutant(m, opts.copy, 2 * timeout_of(m), opts.logs, FULL_FILES[m.tests], "-full")
        o.full_files_status = f.status + (f" by {f.killed_by}" if f.killed_by else "")
        print(f"full files {m.id}: {o.full_files_status} ({f.seconds:.0f} s)", flush=True)
        write_summary(opts, argv, outcomes, not_run, baseline, final=False)

    write_summary(opts, argv, outcomes, not_run, baseline, final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
