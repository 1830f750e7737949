"""The scheduler (asr_app/scheduler.py): batch sizes chosen from measured cost, live requests first, one row
per session per round, rows batched only when they can run in lock-step, a failing row failing alone, and
the texts identical to decoding each clip on its own (real tiny.en pair, real clips)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import soundfile as sf
from conftest import JFK_FLAC, lj_clip

from asr_app.audio import load_audio
from asr_app.batch_sizer import BatchSizer
from asr_app.decoding import DecodingOptions, SpeculativeDecoder
from asr_app.scheduler import (
    CANCEL_POLL_S,
    FILE,
    LIVE,
    ClientGone,
    Scheduler,
    SchedulerBusy,
    SchedulerOptions,
)
from asr_app.scheduler_metrics import SAMPLES_KEPT, BatchSample, SchedulerMetrics, summarise_samples

CLIPS = ["LJ001-0002", "LJ001-0008", "LJ001-0004"]


def test_sizer_grows_while_batching_pays_and_stops_where_it_does_not():
    sizer = BatchSizer(max_rows=8, warmup=0)
    assert sizer.choose(8) == 1          # nothing measured: one row first
    sizer.record(1, 1.0)
    assert sizer.choose(8) == 2          # then try two
    sizer.record(2, 1.2)                 # 0.6 s per row: paid
    assert sizer.choose(8) == 4
    sizer.record(4, 4.0)                 # 1.0 s per row: worse than two
    assert sizer.choose(8) == 2 and sizer.choose(1) == 1 and sizer.choose(3) == 2
    assert sizer.choose(8) != 8          # never tried past a size that stopped paying


def test_sizer_on_a_device_where_batching_is_slower_keeps_one_row():
    sizer = BatchSizer(max_rows=16, warmup=0)
    sizer.record(1, 0.2)
    sizer.record(2, 0.5)                 # 0.25 s per row: slower than one at a time
    assert [sizer.choose(n) for n in (1, 2, 5, 16)] == [1, 1, 1, 1]
    sizer.record(2, 0.38)                # running cost 0.238: still dearer than 0.2
    assert sizer.choose(16) == 1


def test_sizer_needs_a_clear_gain_for_a_larger_batch_unless_rows_are_waiting_anyway():
    sizer = BatchSizer(max_rows=4, margin=0.1, backlog_margin=0.03, warmup=0)
    sizer.record(1, 1.0)
    sizer.record(2, 1.9)                 # 0.95 per row: only 5% cheaper, every row would wait longer
    assert sizer.choose(2) == 1 and sizer.choose(3) == 1
    assert sizer.choose(4) == 2          # four waiting: the later ones are served sooner at 0.95 s a row
    with pytest.raises(ValueError):
        BatchSizer(max_rows=0)


def test_sizer_compares_sizes_at_the_same_tokens_per_row():
    """Each size is measured on different rows: two rows that happened to be short clips must not make
    batching look cheap, nor two long ones make it look dear. With the loop's seconds and steps given,
    sizes are compared at the running mean of steps per row."""
    sizer = BatchSizer(max_rows=4, warmup=0)
    sizer.record(1, 1.0, loop_s=0.8, steps=80)      # a long clip: 0.2 s outside the loop, 10 ms a step
    sizer.record(2, 0.8, loop_s=0.4, steps=20)      # two short ones: 0.4 s a row, yet 20 ms a step
    assert sizer.choose(4) == 1 and sizer.cost[2] > sizer.cost[1]   # seconds per row alone would pick 2
    sizer = BatchSizer(max_rows=4, warmup=0)
    sizer.record(1, 0.3, loop_s=0.1, steps=10)      # a short clip: 10 ms a step
    sizer.record(2, 2.0, loop_s=1.6, steps=320)     # two long ones: 1.0 s a row, yet 5 ms a step
    assert sizer.choose(2) == 2 and sizer.cost[2] < sizer.cost[1]   # seconds per row alone would keep 1
    assert sizer.choose(4) == 4          # batching paid: the next size is measured
    assert sizer.steps_per_row == pytest.approx(0.8 * 10 + 0.2 * 160)


def test_sizer_does_not_judge_a_size_by_its_first_batch():
    # A size's first batch carries one-time work (a new workspace, graphs captured on first use): on an H100
    # it made two rows look far dearer than one, and the scheduler never batched again (docs/serving.md)
    sizer = BatchSizer(max_rows=8)
    sizer.record(1, 5.0)                 # the first batch of one row: warm-up, not counted
    assert sizer.choose(8) == 1 and sizer.snapshot() == {}
    sizer.record(1, 1.0)
    assert sizer.choose(8) == 2
    sizer.record(2, 16.0)                # two rows, first time: captures and tuning, not counted
    assert sizer.choose(8) == 2          # so two rows are measured again
    sizer.record(2, 1.2)                 # 0.6 s per row: paid
    assert sizer.snapshot() == {1: 1.0, 2: 0.6} and sizer.choose(8) == 4


def test_sizer_judges_a_size_again_once_its_measurement_is_stale():
    """A size measured dearer in a passing state of the device is run once more after `retry_after` batches,
    and that batch's cost replaces the old one: batching resumes where it now pays, and where it still does
    not, it costs one batch in `retry_after`."""
    sizer = BatchSizer(max_rows=4, warmup=0, retry_after=5)
    sizer.record(1, 1.0)
    sizer.record(2, 6.0)                 # 3.0 s per row: a bad spell
    chosen = []
    for _ in range(5):
        chosen.append(sizer.choose(4))
        sizer.record(1, 1.0)
    assert chosen == [1] * 5 and sizer.choose(1) == 1
    assert sizer.choose(4) == 2          # five batches since two rows last ran: measured again
    sizer.record(2, 1.2)                 # 0.6 s per row now, replacing 3.0 (mixed in, it would still be 2.5)
    assert sizer.snapshot()[2] == pytest.approx(0.6) and sizer.choose(4) == 4
    still = BatchSizer(max_rows=2, warmup=0, retry_after=5)   # where two rows stay dearer
    still.record(1, 1.0)
    still.record(2, 6.0)
    formed = []
    for _ in range(20):
        formed.append(still.choose(2))
        still.record(formed[-1], 1.0 * formed[-1] if formed[-1] == 1 else 6.0)
    assert [i for i, rows in enumerate(formed) if rows == 2] == [5, 11, 17]   # after five batches of one, no sooner
    both = BatchSizer(max_rows=4, warmup=0, retry_after=5)   # two sizes stale at once: one retry per five batches
    for rows, seconds in ((1, 1.0), (2, 6.0), (4, 12.0)):
        both.record(rows, seconds)
    formed = []
    for _ in range(12):
        formed.append(both.choose(4))
        both.record(formed[-1], {1: 1.0, 2: 6.0, 4: 12.0}[formed[-1]])
    assert [rows for rows in formed if rows > 1] == [2, 4] and formed.index(4) - formed.index(2) >= 5, formed
    stale = BatchSizer(max_rows=2, warmup=0, retry_after=1)
    stale.record(1, 1.0), stale.record(2, 6.0), stale.record(1, 1.0)
    assert stale.choose(2) == 2 and stale.choose(2, retry=False) == 1   # asking whether to wait never retries
    with pytest.raises(ValueError):
        BatchSizer(max_rows=2, retry_after=0)


class Recording:
    """The real decoder, with the sessions of every batch it was handed written down."""

    def __init__(self, decoder: SpeculativeDecoder) -> None:
        self.decoder, self.batches = decoder, []
        self.sessions: dict[int, str] = {}

    pair = property(lambda self: self.decoder.pair)
    options = property(lambda self: self.decoder.options)

    def batch_key(self, options, prompt):
        return self.decoder.batch_key(options, prompt)

    delay_s = 0.0   # added to every decode: a device slower than the requests' arrivals

    def decode(self, clips, options=None, prompts=None, hints=None):
        self.batches.append([self.sessions[id(c)] for c in clips])
        time.sleep(self.delay_s)
        return self.decoder.decode(clips, options, prompts=prompts, hints=hints)


@pytest.fixture(scope="module")
def decoder(tiny_en_pair, one_torch_thread) -> SpeculativeDecoder:
    return SpeculativeDecoder(tiny_en_pair, DecodingOptions(mode="exact"))


def _clip(clip_id: str) -> np.ndarray:
    return load_audio(lj_clip(clip_id))


class OneTimeWork:
    """The real decoder, each decode also doing `extra_s` of work it reports as one-time (setup_s), as a
    decode that captures graphs or times step costs does; with `drops`, each decode also drops a workspace
    (`workspace_stats`), so that work is a recapture that will recur."""

    def __init__(self, decoder: SpeculativeDecoder, extra_s: float, drops: bool = False) -> None:
        from asr_app.decoding.workspaces import WorkspaceStats

        self.decoder, self.extra_s, self.drops, self.decodes = decoder, extra_s, drops, 0
        self.workspace_stats = lambda: WorkspaceStats(1, 1, 1, self.decodes if drops else 0, self.decodes, 0, 0.0)

    pair = property(lambda self: self.decoder.pair)
    options = property(lambda self: self.decoder.options)

    def batch_key(self, options, prompt):
        return self.decoder.batch_key(options, prompt)

    def decode(self, clips, options=None, prompts=None, hints=None):
        time.sleep(self.extra_s)
        results = self.decoder.decode(clips, options, prompts=prompts, hints=hints)
        for result in results:
            result.stats.setup_s += self.extra_s
        self.decodes += 1
        return results


@pytest.mark.parametrize("drops", [False, True])
def test_the_sizer_leaves_out_one_time_work_unless_the_decoder_dropped_what_it_made(decoder, drops):
    # A capture is one-time work while the workspace it went into stays; once the decoder drops workspaces or
    # graphs, what comes back is captured again, and that time is a cost of the batch sizes in use.
    clip = _clip(CLIPS[0])[: 3 * 16_000]
    scheduler = Scheduler(OneTimeWork(decoder, extra_s=1.5, drops=drops), SchedulerOptions(max_rows=1))
    try:
        for _ in range(2):   # the first is the size's warm-up; the second is measured
            started = time.perf_counter()
            scheduler.submit(clip, DecodingOptions(mode="exact")).result(60)
            assert time.perf_counter() - started > 1.5
        cost = scheduler.metrics().sizer["file exact"][1]
        assert cost > 1.5 if drops else 0 < cost < 1.5
        assert scheduler.metrics().workspace_evictions == (2 if drops else 0)
    finally:
        scheduler.close()


def test_each_kind_of_work_has_its_own_batch_sizer(decoder):
    """A live re-decode over its buffer's own frames and a file's whole window cost different amounts per
    row: each kind is measured by its own sizer, so neither's cost stands for the other's at a batch size."""
    clip = _clip(CLIPS[0])[: 3 * 16_000]
    scheduler = Scheduler(decoder, SchedulerOptions(max_rows=4))
    live = DecodingOptions(mode="exact", encoder_context_s=1.0)
    try:
        for _ in range(3):   # each class's first batch is its warm-up; the next two are measured
            scheduler.submit(clip, live, priority=LIVE, session="s").result(60)
            scheduler.submit(clip, DecodingOptions(mode="off"), priority=FILE).result(60)
        costs = scheduler.metrics().sizer   # one sizer would have held one cost for both
        assert set(costs) == {"live exact context", "file off"} and all(set(c) == {1} for c in costs.values())
    finally:
        scheduler.close()


def test_live_first_one_row_per_session_and_same_texts(decoder):
    recording = Recording(decoder)
    scheduler = Scheduler(recording, SchedulerOptions(max_rows=4))
    options = DecodingOptions(mode="exact")
    alone = {c: decoder.decode([_clip(c)], options)[0].text for c in CLIPS}
    jobs = []
    with scheduler.hold():   # queue everything first, so the order is the scheduler's choice
        for session, priority, clip_id in [("file-a", FILE, CLIPS[0]), ("file-a", FILE, CLIPS[1]),
                                           ("file-b", FILE, CLIPS[2]), ("live-1", LIVE, CLIPS[1]),
                                           ("live-2", LIVE, CLIPS[2])]:
            clip = _clip(clip_id)
            recording.sessions[id(clip)] = session
            jobs.append((clip_id, scheduler.submit(clip, options, priority=priority, session=session)))
    texts = [(clip_id, future.result(120).text) for clip_id, future in jobs]
    metrics = scheduler.metrics()
    choices = metrics.choices
    metrics.choices["live exact"][2][9] = 1   # a copy: what a reader does to it never reaches the scheduler
    assert 9 not in scheduler.metrics().choices["live exact"][2]
    del metrics.choices["live exact"][2][9]
    scheduler.close()
    assert all(text == alone[clip_id] for clip_id, text in texts), texts
    # what each batch size was chosen from: the first live batch had both live rows to choose from, the first
    # file batch one row of each file to choose from (one row per session), the last file-a's second window alone
    assert sum(n for by_ready in choices.values() for taken in by_ready.values() for n in taken.values()) == len(
        recording.batches)
    assert set(choices) == {"live exact", "file exact"} and 2 in choices["live exact"]
    assert 2 in choices["file exact"] and choices["file exact"].get(1, {}).get(1, 0) >= 1
    assert all(rows <= ready for by_ready in choices.values() for ready, taken in by_ready.items() for rows in taken)
    order = [s for batch in recording.batches for s in batch]
    assert set(order[:2]) == {"live-1", "live-2"}           # live re-decodes before any file window
    assert all(len(set(batch)) == len(batch) for batch in recording.batches)   # one row per session per batch
    assert order.index("file-b") < len(order) - 1           # file-b's only window does not wait for file-a's second
    assert sum(len(b) for b in recording.batches) == 5


def test_an_empty_hint_is_no_hint(decoder):
    """A re-decode whose previous decode wrote nothing offers an empty hint: it batches with unhinted rows and
    is sized as one. (Counted as hinted, it joined hinted rows, and the decoder turned every row's hint off.)"""
    recording = Recording(decoder)
    scheduler = Scheduler(recording, SchedulerOptions(max_rows=4))
    options = DecodingOptions(mode="exact")
    _batching_pays(scheduler, "live exact")
    clips = [_clip(c)[: 3 * 16_000] for c in CLIPS[:2]]
    try:
        with scheduler.hold():
            jobs = []
            for i, (clip, hint) in enumerate(zip(clips, ([], None))):
                recording.sessions[id(clip)] = f"live-{i}"
                jobs.append(scheduler.submit(clip, options, hint=hint, priority=LIVE, session=f"live-{i}"))
        texts = [job.result(60).text for job in jobs]
        assert recording.batches == [["live-0", "live-1"]]
        assert [s.kind for s in scheduler.metrics().samples] == ["live exact"]
        assert texts == [decoder.decode([clip], options)[0].text for clip in clips]
        # Beside a hinted row it goes in a batch of its own, and the hinted row keeps its hint.
        hint = decoder.decode([clips[0]], options)[0].tokens
        with scheduler.hold():
            hinted = scheduler.submit(clips[0], options, hint=hint, priority=LIVE, session="live-0")
            empty = scheduler.submit(clips[1], options, hint=[], priority=LIVE, session="live-1")
        assert hinted.result(60).stats.hinted > 0 and empty.result(60).text == texts[1]
        assert recording.batches[1:] == [["live-0"], ["live-1"]]
    finally:
        scheduler.close()


def test_a_bad_row_fails_alone_and_a_full_queue_says_busy(decoder):
    scheduler = Scheduler(decoder, SchedulerOptions(max_rows=4, max_queue=3))
    options = DecodingOptions(mode="exact")
    good = _clip("LJ001-0002")
    with scheduler.hold():
        ok = scheduler.submit(good, options, session="a")
        bad = scheduler.submit(np.full(8000, np.nan, np.float32), options, session="b")
        ok2 = scheduler.submit(good, options, session="c")
        with pytest.raises(SchedulerBusy):
            scheduler.submit(good, options, session="d")
    assert "NaN" in str(bad.exception(120))
    assert ok.result(120).text == ok2.result(120).text == decoder.decode([good], options)[0].text
    metrics = scheduler.metrics()
    assert metrics.failed == 1 and metrics.rows == 3 and metrics.queue_depth == 0
    scheduler.close()
    with pytest.raises(RuntimeError, match="shutting down"):
        scheduler.submit(good, options)


def test_client_decoder_is_the_pipeline_interface_and_threads_share_it(decoder):
    """Many threads through one scheduler (what the front ends do): every result is the one-at-a-time result,
    and each client's usage adds up its own decodes only."""
    from asr_app.longform import transcribe
    scheduler = Scheduler(decoder)
    expected = transcribe(decoder, str(JFK_FLAC)).text
    clients = [scheduler.client(DecodingOptions(mode="exact"), session=f"s{i}", timeout_s=300) for i in range(3)]
    results: dict[int, str] = {}

    def work(i: int) -> None:
        results[i] = transcribe(clients[i], str(JFK_FLAC)).text

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    scheduler.close()
    assert [results[i] for i in range(3)] == [expected] * 3
    windows = int(np.ceil(sf.info(str(JFK_FLAC)).duration / 30))
    assert all(c.usage is not None and c.usage.windows >= windows for c in clients)
    assert sum(c.usage.tokens_out for c in clients) == 3 * clients[0].usage.tokens_out


class Instant:
    """A decoder that answers at once (what is tested here is the worker's idle behaviour)."""

    pair = property(lambda self: type("Pair", (), {"device": None})())
    options = DecodingOptions(mode="off")

    def decode(self, clips, options=None, prompts=None, hints=None):
        from types import SimpleNamespace

        from asr_app.decoding.options import DecodingStats
        return [SimpleNamespace(stats=DecodingStats(mode="off", shared_encoder=False)) for _ in clips]


def test_freed_memory_goes_back_once_per_idle_spell_and_never_while_busy(monkeypatch):
    import asr_app.runtime.allocator as allocator

    trims = []
    monkeypatch.setattr(allocator, "release_freed_memory", lambda: trims.append(time.monotonic()) or True)
    scheduler = Scheduler(Instant(), SchedulerOptions(idle_trim_s=0.5))
    try:
        time.sleep(0.7)
        assert trims == []                     # nothing was decoded yet: nothing to give back
        for _ in range(10):                    # busy: a request every 0.05 s, never idle for 0.5 s
            scheduler.submit(np.zeros(1600, np.float32), DecodingOptions(mode="off")).result(5)
            time.sleep(0.05)
        assert trims == []
        time.sleep(1.2)
        assert len(trims) == 1                 # one idle spell after the work: one trim, not one per wait
        scheduler.submit(np.zeros(1600, np.float32), DecodingOptions(mode="off")).result(5)
        time.sleep(1.0)
        assert len(trims) == 2 and scheduler.metrics().trims == 2
    finally:
        scheduler.close()


class Scripted(Instant):
    """Answers after `delay_s` per call, or raises `error` from inside the decode."""

    def __init__(self, delay_s: float = 0.0, error: Exception | None = None) -> None:
        self.delay_s, self.error = delay_s, error

    def decode(self, clips, options=None, prompts=None, hints=None):
        time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return super().decode(clips, options, prompts, hints)


def test_a_call_past_its_timeout_takes_all_its_queued_rows_with_it():
    scheduler = Scheduler(Scripted(), SchedulerOptions(max_rows=4))
    client = scheduler.client(DecodingOptions(mode="off"), timeout_s=0.3)
    try:
        with scheduler.hold():   # nothing starts: every row of the call stays queued
            with pytest.raises(TimeoutError, match="no decoder time within 0.3 s"):
                client.decode([np.zeros(1600, np.float32)] * 3)
            assert scheduler.metrics().queue_depth == 0   # none left to take decoder time from others
    finally:
        scheduler.close()


def test_the_timeout_bounds_the_whole_call_not_each_row():
    # one row at a time, 0.25 s each: three rows need 0.75 s, more than the call's 0.5 s
    scheduler = Scheduler(Scripted(delay_s=0.25), SchedulerOptions(max_rows=1))
    client = scheduler.client(DecodingOptions(mode="off"), timeout_s=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="no decoder time"):
            client.decode([np.zeros(1600, np.float32)] * 3)
        assert time.monotonic() - started < 0.7
    finally:
        scheduler.close()


def test_a_request_whose_client_went_away_leaves_the_queue_and_queues_nothing_more():
    scheduler = Scheduler(Scripted(), SchedulerOptions(max_rows=4))
    gone = threading.Event()
    client = scheduler.client(DecodingOptions(mode="off"), cancelled=gone)
    try:
        with scheduler.hold():   # queued, waiting for the decoder, when the client leaves
            threading.Timer(0.3, gone.set).start()
            started = time.monotonic()
            with pytest.raises(ClientGone):
                client.decode([np.zeros(1600, np.float32)] * 2)
            assert time.monotonic() - started < 0.3 + CANCEL_POLL_S + 1.0   # (a slow, loaded machine's margin)
            assert scheduler.metrics().queue_depth == 0
        with pytest.raises(ClientGone):   # the next window is never queued
            client.decode(np.zeros(1600, np.float32))
        assert scheduler.metrics().rows == 0
    finally:
        scheduler.close()


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_a_timeout_raised_by_the_decode_itself_is_reported_as_it_is(timeout_s):
    scheduler = Scheduler(Scripted(error=TimeoutError("the model did not answer")), SchedulerOptions(max_rows=1))
    client = scheduler.client(DecodingOptions(mode="off"), timeout_s=timeout_s)
    try:
        with pytest.raises(TimeoutError, match="the model did not answer"):
            client.decode(np.zeros(1600, np.float32))
    finally:
        scheduler.close()


def test_loop_figures_count_each_rows_steps_and_leave_out_redone_rows():
    """The sizer's loop seconds and steps come from one decode of the batch: a row's steps are its tokens
    (the end included), one for a row that wrote nothing; a failed row, or a row redone over the whole
    window after its shortened decode (its figures add two decodes'), gives none."""
    from asr_app.decoding.options import DecodingResult, DecodingStats
    from asr_app.scheduler import _loop_figures

    def result(tokens: int, retries: int = 0) -> DecodingResult:
        stats = DecodingStats(mode="exact", shared_encoder=True, tokens_out=tokens, setup_s=0.1, encoder_s=0.3,
                              total_s=1.0, context_retries=retries)
        return DecodingResult(list(range(tokens)), "", [], 0.0, 0.0, stats)

    loop_s, steps = _loop_figures([result(10), result(0)])
    assert loop_s == pytest.approx(0.6) and steps == 11
    assert _loop_figures([result(10), result(5, retries=1)]) == (None, None)
    assert _loop_figures([result(10), ValueError("a bad row")]) == (None, None)


def test_one_kinds_costs_leave_another_kinds_batch_size_alone(decoder):
    """Batching that pays for live re-decodes says nothing about file windows: each kind's sizer
    grows on its own measurements only."""
    scheduler = Scheduler(decoder, SchedulerOptions(max_rows=4))
    try:
        live, files = scheduler.sizer("live exact hint"), scheduler.sizer("file exact")
        for rows, seconds in ((1, 5.0), (1, 1.0), (2, 9.0), (2, 1.0)):   # first of each size: warm-up
            live.record(rows, seconds)
        files.record(1, 5.0), files.record(1, 1.0)
        assert live.choose(4) == 4 and files.choose(4) == 2   # live paid at two rows; files try two first
        assert scheduler.metrics().sizer == {"file exact": {1: 1.0}, "live exact hint": {1: 1.0, 2: 0.5}}
    finally:
        scheduler.close()


def test_batch_samples_keep_the_latest_and_summarise_per_kind_and_size():
    metrics = SchedulerMetrics()
    for n in range(1, SAMPLES_KEPT + 11):
        metrics.batches = n
        metrics.note_sample(BatchSample(batch=n, kind="live exact", ready=2, rows=1, costs={1: 0.1}, wall_s=0.2,
                                        cpu_s=0.1, one_time_s=0.0, decode_s=0.15, encoder_s=0.05, loop_s=0.1,
                                        target_calls=3))
    assert len(metrics.samples) == SAMPLES_KEPT and metrics.samples[0].batch == 11
    before = SchedulerMetrics(batches=SAMPLES_KEPT + 5)
    assert [s.batch for s in metrics.samples_since(before)] == list(range(SAMPLES_KEPT + 6, SAMPLES_KEPT + 11))
    assert summarise_samples(metrics.samples)["live exact"][1] == pytest.approx(
        {"batches": SAMPLES_KEPT, "s_per_row": 0.2, "cpu_share": 0.5, "decoder_share": 0.75})


def _batching_pays(scheduler: Scheduler, kind: str = "file exact") -> None:
    """Costs as a device where two rows cost less per row than one (first batches of a size: warm-up)."""
    sizer = scheduler.sizer(kind)
    for rows, seconds in ((1, 5.0), (1, 1.0), (2, 9.0), (2, 1.2)):
        sizer.record(rows, seconds)


def test_file_rows_still_arriving_are_gathered_into_one_batch(decoder):
    """Uploads arrive apart (each is read and checked first), faster than they are decoded: where batching
    pays, once a second one came soon after the first, while the first still waited, the worker waits up to
    gather_s for more instead of decoding each alone as it comes; the first cannot know and goes alone. The
    texts stay each clip's own."""
    scheduler = Scheduler(decoder, SchedulerOptions(max_rows=4, gather_s=3.0))
    recording = Recording(decoder)
    recording.delay_s = 1.2   # each decode outlasts the 0.5 s between uploads
    scheduler.decoder = recording
    options = DecodingOptions(mode="exact")
    clips = [_clip(c)[: 3 * 16_000] for c in (*CLIPS, CLIPS[0], CLIPS[1])]
    try:
        _batching_pays(scheduler)
        jobs = []
        for i, clip in enumerate(clips):
            recording.sessions[id(clip)] = f"upload-{i}"
            jobs.append(scheduler.submit(clip, options, session=f"upload-{i}"))
            assert i != 1 or not jobs[0].done(), "the first upload was decoded before the second came: no overlap"
            time.sleep(0.5)   # less than a decode apart: without gathering, each would go alone
        texts = [job.result(60).text for job in jobs]
        assert recording.batches == [["upload-0"], [f"upload-{i}" for i in range(1, 5)]]
        assert texts == [decoder.decode([clip], options)[0].text for clip in clips]
        metrics = scheduler.metrics()
        assert metrics.gathers == 1
        # Each batch's sample: what its size was chosen from, and where its time went.
        first, second = metrics.samples
        assert (first.kind, first.ready, first.rows, second.ready, second.rows) == ("file exact", 1, 1, 4, 4)
        assert first.costs == pytest.approx({1: 1.0, 2: 0.6}) and (first.batch, second.batch) == (1, 2)
        for sample in (first, second):
            assert 0 < sample.cpu_s and 0 < sample.encoder_s < sample.decode_s <= sample.wall_s
            assert sample.loop_s is not None and 0 < sample.loop_s < sample.decode_s and sample.target_calls > 0
        summary = summarise_samples(metrics.samples)
        assert list(summary) == ["file exact"] and sorted(summary["file exact"]) == [1, 4]
        assert summary["file exact"][4]["s_per_row"] == pytest.approx((second.wall_s - second.one_time_s) / 4)
        assert 0 < summary["file exact"][4]["decoder_share"] <= 1
    finally:
        scheduler.close()


def test_a_lone_request_requests_in_turn_and_a_device_where_batching_does_not_pay_never_wait(decoder):
    """gather_s is 30 s here, and every result is awaited for at most 20 s: a wait would fail the test. In
    turn: one file's windows (one session), and an API client's requests one after the other (a session each,
    as the server names them: close together, yet never overlapping)."""
    clip = _clip(CLIPS[0])[: 3 * 16_000]
    options = DecodingOptions(mode="exact")
    for case in ("alone", "one file's windows in turn", "requests in turn", "batching does not pay"):
        scheduler = Scheduler(decoder, SchedulerOptions(max_rows=4, gather_s=30.0))
        try:
            if case == "batching does not pay":
                sizer = scheduler.sizer("file exact")
                for rows, seconds in ((1, 5.0), (1, 1.0), (2, 9.0), (2, 3.0)):   # two rows dearer per row
                    sizer.record(rows, seconds)
                first = scheduler.submit(clip, options)
                second = scheduler.submit(clip, options)           # arriving together, yet one row pays best
                first.result(20), second.result(20)
            else:
                _batching_pays(scheduler)
                for k in range(1 if case == "alone" else 3):       # each sent once the one before is done
                    session = f"request-{k}" if case == "requests in turn" else "one-file"
                    scheduler.submit(clip, options, session=session).result(20)
            assert scheduler.metrics().gathers == 0, case
        finally:
            scheduler.close()


def test_the_scheduler_keeps_room_for_its_batch_sizes_and_reports_graph_captures(tiny_en_pair, one_torch_thread):
    # Steps captured (emulated here as on a GPU): the decoder's default pool holds 4 workspaces; a scheduler
    # forming batches of 1-16 rows asks for all five sizes, with drafts and without, and its metrics carry
    # the captures the decodes made (a pool too small for the sizes would recapture them in turn).
    from asr_app.decoding import RuntimeOptions
    from asr_app.decoding.workspaces import DEFAULT_WORKSPACES

    emulated = SpeculativeDecoder(tiny_en_pair, DecodingOptions(mode="exact", max_new_tokens=8),
                                  runtime=RuntimeOptions(cuda_graphs="emulate"))
    assert emulated.workspace_stats().max_workspaces == DEFAULT_WORKSPACES == 4
    scheduler = Scheduler(emulated, SchedulerOptions(max_rows=16))
    try:
        assert emulated.workspace_stats().max_workspaces == 10
        futures = [scheduler.submit(_clip(c), DecodingOptions(mode="exact", max_new_tokens=8), session=c)
                   for c in ("LJ001-0001", "LJ001-0002")]
        assert all(f.result(timeout=120).tokens for f in futures)
        m = scheduler.metrics()   # the figures are the decoder's own, carried over
        stats = emulated.workspace_stats()
        assert m.graph_captures == stats.captures > 0 and m.graph_capture_s == stats.capture_s > 0
        assert (m.workspaces, m.workspace_rows) == (stats.workspaces, stats.rows) and m.workspaces >= 1
    finally:
        scheduler.close()
    fixed = SpeculativeDecoder(tiny_en_pair, runtime=RuntimeOptions(cuda_graphs="emulate", max_workspaces=2))
    Scheduler(fixed, SchedulerOptions(max_rows=16)).close()
    assert fixed.workspace_stats().max_workspaces == 2   # a bound the user set is kept (memory on large models)
    bare = SpeculativeDecoder(tiny_en_pair, DecodingOptions(mode="exact"))
    eager = Scheduler(bare)  # eager steps: no workspaces kept, figures stay zero
    try:
        eager.submit(_clip("LJ001-0001"), DecodingOptions(mode="exact", max_new_tokens=4)).result(timeout=120)
        assert (eager.metrics().workspaces, eager.metrics().graph_captures) == (0, 0)
    finally:
        eager.close()


def test_warm_up_captures_every_batch_size_before_serving(tiny_en_pair, one_torch_thread):
    # asr-serve on a GPU decodes the sample at every size it forms before the first request: a request then
    # finds its workspace and steps captured (emulated here; costs pinned, so the same clip picks the same
    # widths). Eager steps (a CPU) have nothing to capture; a fixed bound gets only the sizes it has room for.
    from asr_app.decoding import RuntimeOptions

    clip = _clip("LJ001-0001")[: 4 * 16_000]
    opts = DecodingOptions(mode="exact", max_new_tokens=8, timestamps=True)
    emulated = SpeculativeDecoder(tiny_en_pair, opts, runtime=RuntimeOptions(cuda_graphs="emulate"))
    scheduler = Scheduler(emulated, SchedulerOptions(max_rows=4))
    try:
        assert scheduler.warm_up(clip, [opts]) == 3   # 1, 2 and 4 rows
        warmed = emulated.workspace_stats()
        assert (warmed.workspaces, warmed.rows) == (3, 7) and warmed.captures > 0
        assert scheduler.metrics().graph_captures == warmed.captures
        scheduler.submit(clip, opts).result(timeout=120)
        assert emulated.workspace_stats().captures == warmed.captures   # nothing left to capture
        with pytest.raises(RuntimeError, match="not served yet"):
            scheduler.warm_up(clip, [opts])
    finally:
        scheduler.close()
    tight = SpeculativeDecoder(tiny_en_pair, opts, runtime=RuntimeOptions(cuda_graphs="emulate", max_workspaces=2))
    small = Scheduler(tight, SchedulerOptions(max_rows=4))
    try:
        assert small.warm_up(clip, [opts]) == 2 and tight.workspace_stats().evictions == 0
    finally:
        small.close()
    eager = Scheduler(SpeculativeDecoder(tiny_en_pair, opts))
    try:
        assert eager.warm_up(clip, [opts]) == 0
    finally:
        eager.close()


def test_asr_serve_warms_up_in_the_options_a_request_gets_and_stops_where_memory_runs_out(
        tiny_en_pair, one_torch_thread, capsys):
    # Without a draft the service decodes in `off` even though --mode defaults to exact: the warm-up must take
    # the mode a request gets, not the flag's. A size that fails (out of memory on a GPU) ends the warm-up and
    # caps the batches below it.
    import dataclasses

    from asr_app.decoding import RuntimeOptions
    from asr_app.serve.cli import warm_up
    from asr_app.ui.engine import UiEngine

    target_only = dataclasses.replace(tiny_en_pair, draft=None, draft_name=None)
    decoder = SpeculativeDecoder(target_only, DecodingOptions(mode="off", max_new_tokens=8),
                                 runtime=RuntimeOptions(cuda_graphs="emulate"))
    engine = UiEngine.from_decoder(decoder).sharing(scheduler=Scheduler(decoder, SchedulerOptions(max_rows=2)))
    try:
        warm_up(engine)
        assert "warmed up: 2 batch sizes" in capsys.readouterr().out
        assert set(decoder._workspaces) == {(1, False), (2, False)}   # no drafts: the mode a request gets
    finally:
        engine.scheduler.close()

    class OutOfMemoryAt4:
        graph_mode, pair = "cuda", tiny_en_pair

        def __init__(self) -> None:
            self.sizes: list[int] = []

        def workspace_stats(self):
            from asr_app.decoding.workspaces import WorkspaceStats
            return WorkspaceStats(0, 12, 0, 0, 0, 0, 0.0)

        def decode(self, clips, options=None, prompts=None, hints=None):
            self.sizes.append(len(clips))
            if len(clips) >= 4:
                raise RuntimeError("CUDA out of memory")
            return [None] * len(clips)

    failing = OutOfMemoryAt4()
    scheduler = Scheduler(failing, SchedulerOptions(max_rows=16))
    try:
        assert scheduler.warm_up(np.zeros(16_000, np.float32), [DecodingOptions(mode="exact")]) == 2
        assert failing.sizes == [1, 2, 4] and scheduler.sizer("file exact").sizes == [1, 2]
    finally:
        scheduler.close()


def test_sizer_choices_add_up_across_replicas_and_since_a_copy():
    from asr_app.scheduler_metrics import SchedulerMetrics
    a = SchedulerMetrics()
    for ready, rows in [(3, 2), (3, 2), (1, 1), (40, 8)]:
        a.note_choice("file exact", ready, rows, cap=16)
    assert a.choices == {"file exact": {3: {2: 2}, 1: {1: 1}, 16: {8: 1}}}   # 40 ready counted at the cap
    before = SchedulerMetrics(choices=a.copy_choices())
    a.note_choice("file exact", 3, 2, cap=16)
    a.note_choice("live exact", 2, 1, cap=16)
    assert before.choices["file exact"][3] == {2: 2}   # a copy: later choices do not reach it
    assert a.choices_since(before) == {"file exact": {3: {2: 1}}, "live exact": {2: {1: 1}}}
    total = SchedulerMetrics()
    total.add_choices(a.choices)
    total.add_choices(before.choices)
    assert total.choices["file exact"] == {3: {2: 5}, 1: {1: 2}, 16: {8: 2}}
