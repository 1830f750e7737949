"""Every option of every front end is honoured or refused (issue 31, part 2).

The five front ends (asr-transcribe, asr-stream, asr-eval, python app.py, asr-serve) are enumerated from
their own argparse parsers, and each is run, models and audio faked, once with its defaults and once with
each option set: an option is honoured when what the front end builds from it (the loader's arguments, the
decoding, runtime, long-form, streaming, cluster or evaluation options, the web page's starting controls,
the server's launch arguments, the service's engine, access and what a client gets by default, the Ray Serve
deployments, the outputs) differs; refused when the run stops with exit status 2 and one
error line before any model loads. An option added without being wired anywhere changes nothing and fails
here, even when nobody adds it to the tables below: options missing from them get a probe of their own
(a flag, another choice, a changed number) that must be honoured.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import re
import shutil
import tempfile
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import REPO_ROOT

from asr_app import kernel_cache, ports
from asr_app.cli import stream as stream_cli
from asr_app.cli import transcribe as transcribe_cli
from asr_app.decoding.options import Segment, Word
from asr_app.eval import cli as eval_cli
from asr_app.serve import cli as serve_cli
from asr_app.streaming import StreamEvent
from asr_app.streaming import Word as StreamWord
from asr_app.transcript import Transcript
from asr_app.ui import app as ui_app

PARSERS = {"asr-transcribe": lambda: transcribe_cli.build_parser(), "asr-stream": lambda: stream_cli.build_parser(),
           "asr-eval": lambda: eval_cli.build_parser(), "app.py": lambda: ui_app.build_parser(),
           "asr-serve": lambda: serve_cli.build_parser()}
BASE_ARGV = {"asr-transcribe": "IN", "asr-stream": "--simulate AUDIO", "asr-eval": "", "app.py": "",
             "asr-serve": ""}

# A probe is "X:ARGV" or "X:ARGV | BASELINE": the front end run with ARGV and with BASELINE (default: none),
# each after the front end's BASE_ARGV unless it starts with "=", in a fresh folder where IN is a folder of
# two clips (one in a sub-folder), AUDIO one clip, OUT an output folder and DONE one that already holds
# a.txt. X is H (honoured: what the run builds differs), H! (honoured, on stderr: a progress line or the
# statistics) or R (refused). Options absent here get automatic probes that must be honoured.
T, S, E, A, V = "asr-transcribe", "asr-stream", "asr-eval", "app.py", "asr-serve"
MODEL_PROBES = {
    "model": ["H:--model base", "H:--model org/whisper-x"],
    "target": ["H:--target org/whisper-x"],
    "draft": ["H:--draft none", "H:--draft derived"],
    "device": ["H:--device cpu"],
    "dtype": ["H:--dtype float32"],
    "draft_dtype": ["H:--draft-dtype float16"],
    "temperature": ["H:--temperature 0.4"],
    "language": ["H:--language fr"],
    "beam_size": ["R:--beam_size 2"],
    "gamma": ["H:--gamma 3", "H:--gamma heuristic"],
    "draft_vocab": ["H:--draft-vocab 0"],
    "alpha": ["H:--mode sigmoid --alpha -10 | --mode sigmoid", "R:--mode exact --alpha -10"],
    "beta": ["H:--mode sigmoid --beta 10 | --mode sigmoid", "R:--mode baseline --beta 10"],
}
PROBES: dict[str, dict[str, list[str]]] = {
    T: {**MODEL_PROBES,
        "paths": ["H:=IN/sub/b.flac"],
        "output_dir": ["H:-o OUT"],
        "format": ["H:-f srt", "H:-o OUT -f all"],
        "max_words_per_line": ["H:-f srt --word_timestamps --max_words_per_line 1 | -f srt --word_timestamps",
                               "R:-f srt --max_words_per_line 1"],
        "skip_existing": ["H:-o DONE --skip-existing | -o DONE", "R:--skip-existing"],
        "quiet": ["H!:--quiet"],
        "address": ["H:--engine ray --address auto | --engine ray", "R:--address auto"],
        "num_workers": ["H:--engine ray --num-workers 3 | --engine ray", "R:--num-workers 3"],
        "gpus_per_worker": ["H:--engine ray --gpus-per-worker 0.5 | --engine ray", "R:--gpus-per-worker 0.5"],
        "file_timeout": ["H:--engine ray --file-timeout 30 | --engine ray", "R:--file-timeout 30"],
        "temperature": ["H:--temperature 0.4", "H:--temperature 0,0.5,1"],
        "temperature_increment_on_fallback": ["H:--temperature_increment_on_fallback 0.25",
                                              "R:--no-fallback --temperature_increment_on_fallback 0.25",
                                              "R:--temperature 0,0.5 --temperature_increment_on_fallback 0.25"],
        },
    S: {**MODEL_PROBES,
        "simulate": ["H:="],
        "frontier": ["H:--policy alignatt --frontier 0.7 | --policy alignatt", "R:--frontier 0.7"],
        "edge": ["H:--edge 0.6", "R:--policy alignatt --edge 0.6"],
        "input_device": ["H:=--input-device 2 | =", "R:--input-device 2"],
        "stats": ["H!:--stats"],
        "server": ["H:--server ws://host:1", "R:--server ws://host:1 --policy alignatt"],  # asr-serve decodes
        "api_key": ["H:--server ws://host:1 --api-key k | --server ws://host:1", "R:--api-key k"],
        "temperature": ["H:--temperature 0.4", "R:--temperature 0,0.5,1"],
        },
    E: {**MODEL_PROBES,
        "mode": ["R:--mode exact"],  # asr-eval compares --modes
        "split": ["H:--split test-other", "R:--dataset ljspeech --split test-other"],
        "modes": ["H:--modes exact,off"],
        "sweep_scale": ["H:--sweep-scale 1e2"],
        "temperature": ["H:--temperature 0.4", "R:--temperature 0,0.5,1"],
        "alpha": ["H:--alpha -10", "R:--modes exact --alpha -10"],
        "beta": ["H:--beta 10", "R:--modes exact,baseline --sweep-scale 10 --beta 10"],
        "temperatures": ["H:--seeds 2 --temperatures 0.6,1 | --seeds 2", "R:--temperatures 0.6"],  # the study's
        "wer_reference": ["H:--seeds 2 --wer-reference text | --seeds 2", "R:--wer-reference text"],
        },
    A: {**MODEL_PROBES,
        "mode": ["H:--mode off", "H:--mode sigmoid", "R:--mode hf"],
        "temperature": ["H:--temperature 0.4", "H:--temperature 0,0.5,1"],
        "alpha": ["H:--alpha -10"],  # the web app offers sigmoid beside the other modes
        "beta": ["H:--beta 10"],
        "cpu_kernel_cache": ["H:--cpu-kernel-cache 128", "R:--cpu-kernel-cache 0"],
        },
    # asr-serve: "--engine ray" runs the Ray Serve path with Ray faked (what it would deploy is recorded, the
    # bodies of its deployments are built here); a port below 1024 cannot be bound (the fake port_problem)
    V: {**MODEL_PROBES,
        "model": ["H:--model base", "H:--engine ray --model base | --engine ray"],  # what each replica loads
        "device": ["H:--device cpu", "H:--engine ray --device cpu | --engine ray",
                   "H:--engine ray --device cuda --gpus-per-replica 1 | --engine ray --gpus-per-replica 1",
                   "H:--engine ray --device cuda:1 --gpus-per-replica 2 | --engine ray --gpus-per-replica 2",
                   "R:--engine ray --device cuda", "R:--engine ray --device cuda:1 --gpus-per-replica 1",
                   "R:--engine ray --device cpu --gpus-per-replica 1"],  # a replica sees only its GPUs
        "mode": ["H:--mode off", "H:--mode sigmoid", "R:--mode hf"],  # requests and sessions decode in these
        "temperature": ["H:--temperature 0.4", "H:--temperature 0,0.5,1",
                        "H:--engine ray --temperature 0,0.5,1 | --engine ray"],
        "task": ["H:--task translate"],  # live sessions translate; an upload picks its endpoint
        "threads": ["H:--threads 2", "H:--engine ray --threads 2 | --engine ray"],  # a replica's CPU slots
        "host": ["H:--host localhost", "H:--host 0.0.0.0 --api-key secret-key-1 | --api-key secret-key-1",
                 "H:--engine ray --host localhost | --engine ray", "R:--host 0.0.0.0",
                 "R:--engine ray --host 0.0.0.0"],
        "port": ["H:--port 8123", "H:--engine ray --port 8123 | --engine ray", "R:--port 80"],
        "api_key": ["H:--api-key secret-key-1", "H:--engine ray --api-key secret-key-1 | --engine ray",
                    "R:--api-key short"],
        "cors_origin": ["H:--cors-origin https://a.example",
                        "H:--cors-origin https://a.example --cors-origin https://b.example "
                        "| --cors-origin https://a.example",
                        "H:--engine ray --cors-origin https://a.example | --engine ray"],
        "max_sessions": ["H:--max-sessions 2", "H:--engine ray --max-sessions 2 | --engine ray",
                         "R:--max-sessions 0"],
        "max_upload_mb": ["H:--max-upload-mb 5", "R:--max-upload-mb 0"],
        "max_upload_minutes": ["H:--max-upload-minutes 1", "R:--max-upload-minutes -1"],
        "max_chunk_seconds": ["H:--max-chunk-seconds 2", "R:--max-chunk-seconds 0"],
        "request_timeout": ["H:--request-timeout 30", "H:--engine ray --request-timeout 30 | --engine ray",
                            "R:--request-timeout 0"],
        "live_encoder_context": ["H:--live-encoder-context 4", "H:--live-encoder-context 0",
                                 "H:--engine ray --live-encoder-context 4 | --engine ray",
                                 "R:--live-encoder-context 40", "R:--live-encoder-context -1"],
        "live_settle": ["H:--live-settle 1.5", "H:--engine ray --live-settle 1.5 | --engine ray",
                        "R:--live-settle 0.2", "R:--live-settle 40"],
        "cpu_kernel_cache": ["H:--cpu-kernel-cache 128", "H:--engine ray --cpu-kernel-cache 128 | --engine ray",
                             "R:--cpu-kernel-cache 0"],
        "no_ui": ["H:--no-ui", "H:--engine ray --no-ui | --engine ray"],
        "no_warm_up": ["H:--no-warm-up", "R:--engine ray --no-warm-up"],
        "engine": ["H:--engine ray"],
        "address": ["H:--engine ray --address auto | --engine ray", "R:--address auto"],
        "replicas": ["H:--engine ray --replicas 2 | --engine ray", "R:--replicas 2",
                     "R:--engine ray --replicas 0",
                     "R:--engine ray --replicas 2 --min-replicas 1 --max-replicas 3"],  # autoscaled instead
        "min_replicas": ["H:--engine ray --min-replicas 1 --max-replicas 3 | --engine ray",
                         "H:--engine ray --min-replicas 0 --max-replicas 3 "
                         "| --engine ray --min-replicas 1 --max-replicas 3",
                         "R:--engine ray --min-replicas 1", "R:--min-replicas 1 --max-replicas 3",
                         "R:--engine ray --min-replicas 3 --max-replicas 2"],
        "max_replicas": ["H:--engine ray --min-replicas 1 --max-replicas 2 "
                         "| --engine ray --min-replicas 1 --max-replicas 3",
                         "R:--engine ray --max-replicas 3", "R:--max-replicas 3"],
        "gpus_per_replica": ["H:--engine ray --gpus-per-replica 0.5 | --engine ray",
                             "R:--gpus-per-replica 0.5", "R:--engine ray --gpus-per-replica -1"],
        "replica_batching": ["H:--engine ray --replica-batching serve | --engine ray",
                             "R:--replica-batching serve"],
        },
}


# ---------------------------------------------------------------------------------------------- the fakes
class Recorder(dict):
    """What a run built, by kind: the trace compared between a baseline and a probe."""

    def put(self, key: str, value) -> None:
        self[key] = _plain(value)


def _plain(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def _fake_pair(recorder: Recorder, **kwargs):
    recorder.put("load", kwargs)
    config = SimpleNamespace(is_multilingual=True)
    return SimpleNamespace(target=SimpleNamespace(generation_config=config), draft=object(), target_name="t",
                           draft_name="d", shared_encoder=True, device=torch.device("cpu"), dtype=torch.float32,
                           draft_dtype=None, processor=SimpleNamespace(tokenizer=None))


class FakeDecoder:
    def __init__(self, pair, options, runtime=None, recorder: Recorder | None = None):
        self.pair, self.options, self.runtime = pair, options, runtime
        recorder.put("decoding", options)
        recorder.put("runtime", runtime)


def _transcript(path) -> Transcript:
    words = [Word(" Hello", 0.0, 0.4, 0.9), Word(" there,", 0.4, 0.8, 0.9), Word(" friend.", 0.8, 1.2, 0.9)]
    segment = Segment(0.0, 1.2, " Hello there, friend.", [1, 2, 3], words)
    return Transcript(Path(path).name, 1.2, segment.text, [segment], "en", "exact", model={"target": "t"})


class FakeRay:
    def __init__(self, make_decoder, make_options, cluster, recorder):
        from asr_app.cluster import ClusterReport

        recorder.put("cluster", cluster)
        recorder.put("transcribe", make_options(make_decoder()))
        self.recorder, self.report = recorder, ClusterReport()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def run(self, items, batch_size=1, durations=None):
        self.recorder.put("ray_batch", batch_size)
        self.recorder.put("items", [Path(p).name for _, p in items])
        for key, path in items:
            yield key, _transcript(path)


class FakeProcessor:
    def __init__(self, decoder, options, recorder):
        recorder.put("streaming", options)
        self.compute_s, self.audio_seconds, self.prompt_retries = 0.0, 0.0, 0

    def insert_audio(self, block):
        self.audio_seconds += len(block) / 16000

    def process(self):
        words = [StreamWord(0.0, 0.5, "Hello"), StreamWord(0.5, 1.0, "there.")]
        return [StreamEvent("partial", "Hello", 0.0, 0.5, 0.1, 0.5),
                StreamEvent("commit", "Hello there.", 0.0, 1.0, 1.2, 1.0, words=words)]

    def finish(self):
        return []


class FakeMicrophone:
    device_name = "microphone"

    def __init__(self, block_s, device, recorder):
        recorder.put("source", ("microphone", block_s, device))

    def __iter__(self):
        return iter([np.zeros(1600, np.float32)] * 3)


class FakeRemoteScheduler:
    """The Ray Serve ingress's scheduler: its rows would go to the decoder replicas."""

    def __init__(self, handle, pair, default_options, board=None, **kwargs):
        self.pair = pair

    def client(self, options, **kwargs):
        return SimpleNamespace(options=options, **kwargs)

    def close(self) -> None:
        pass


class TtyOut(io.StringIO):
    def isatty(self) -> bool:
        return True


# Built and then not what decides the outcome: the web app decodes with each session's options (`session`:
# the launch's options with the page's starting controls), not with the launch decoder's own; asr-serve with
# each request's and live session's (`upload`, `live`: what a client leaving every field out gets).
UNUSED = {"app.py": {"decoding"}, "asr-serve": {"decoding"}}
_PAGES: dict[tuple, list] = {}   # the web page's starting controls, by what they may depend on
_BASELINES: dict[tuple, tuple] = {}


@pytest.fixture
def recorder(monkeypatch):
    """Models, Ray, audio sources, the evaluation and the web server replaced by recorders."""
    import uvicorn

    import asr_app.decoding.engine
    import asr_app.longform
    import asr_app.models.loading
    from asr_app.serve import api as serve_api
    from asr_app.serve import app as serve_app
    from asr_app.serve import ray_engine, ray_launch

    rec = Recorder()
    monkeypatch.setattr("asr_app.arguments.check_reachable", lambda spec: None)

    def bound_in_a_copy(entries: int | None) -> kernel_cache.KernelCacheBound:
        # The services' kernel-cache bound, set in a copy: this process and later runs see no trace of it.
        # Not recorded: what shows it is the startup line, and what Ray would give its replicas.
        return kernel_cache.bound_kernel_cache(entries, environ={})

    monkeypatch.setattr(ui_app, "bound_kernel_cache", bound_in_a_copy)
    monkeypatch.setattr(serve_cli, "bound_kernel_cache", bound_in_a_copy)

    def replica_bound(entries: int | None) -> kernel_cache.KernelCacheBound:   # what a Ray replica sets
        bound = bound_in_a_copy(entries)
        rec.put("replica_kernel_cache", str(bound))
        return bound

    monkeypatch.setattr(ray_engine, "bound_kernel_cache", replica_bound)
    monkeypatch.setattr(asr_app.models.loading, "load_pair", lambda **kw: _fake_pair(rec, **kw))
    monkeypatch.setattr(asr_app.decoding.engine, "SpeculativeDecoder",
                        lambda pair, options, runtime=None: FakeDecoder(pair, options, runtime, rec))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: rec.put("threads", n))

    def transcribe_many(decoder, items, options, on_progress=None):
        items = list(items)
        rec.put("transcribe", options)
        rec.put("items", [Path(p).name for _, p in items])
        for key, path in items:
            yield key, _transcript(path)

    monkeypatch.setattr(asr_app.longform, "transcribe_many", transcribe_many)
    monkeypatch.setattr("asr_app.cluster.RayTranscriber", lambda d, o, c: FakeRay(d, o, c, rec))
    # asr-stream
    monkeypatch.setattr(stream_cli, "FileSource", lambda path, block_s, realtime: (
        rec.put("source", ("file", Path(path).name, block_s, realtime)) or [np.zeros(1600, np.float32)] * 3))
    monkeypatch.setattr(stream_cli, "MicrophoneSource", lambda block_s, device: FakeMicrophone(block_s, device, rec))
    monkeypatch.setattr(stream_cli, "StreamingProcessor", lambda decoder, options: FakeProcessor(decoder, options, rec))

    def stream_to_server(options, blocks, on_events):  # asr-stream --server URL
        rec.put("remote", options)
        for _ in blocks:
            on_events(FakeProcessor(None, None, Recorder()).process())
        return {"audio_s": 0.3}

    monkeypatch.setattr(stream_cli, "stream_to_server", stream_to_server, raising=False)
    # asr-eval
    monkeypatch.setattr(eval_cli, "load_dataset", lambda name, data_dir, split, max_samples: (
        rec.put("dataset", (name, data_dir, split, max_samples)) or []))
    monkeypatch.setattr(eval_cli, "normalizer_for_tokenizer", lambda tokenizer, name: (str.lower, False))

    def run_evaluation(decoder, utterances, specs, normalizer, **kwargs):
        rec.put("evaluation", ([(s.label, s.options) for s in specs], kwargs))
        return SimpleNamespace(failures=[], records=[0])

    monkeypatch.setattr(eval_cli, "run_evaluation", run_evaluation)

    def run_study_cli(args, decoder, utterances, specs, normalizer, meta, out_dir):  # asr-eval --seeds N
        rec.put("study", ([getattr(args, k, None) for k in ("seeds", "temperatures", "wer_reference")],
                          [(s.label, s.options) for s in specs], utterances))
        return 0

    monkeypatch.setattr(eval_cli, "run_study_cli", run_study_cli, raising=False)

    def write_outputs(run, meta, out_dir):
        rec.put("meta", {k: v for k, v in meta.items() if k not in ("command", "created_utc")})
        rec.put("out_dir", re.sub(r"\d{8}T\d{6}Z", "<time>", str(out_dir)))

    monkeypatch.setattr(eval_cli, "write_outputs", write_outputs)
    monkeypatch.setattr(eval_cli, "print_tables", lambda *a: None)
    # python app.py: the real page is built (its starting controls are read back), nothing is served
    real_build = ui_app.build_app

    def build_app(engine):
        # The page is built once per distinct starting point (building it takes ~0.5 s)
        key = (engine.base_options.mode, engine.base_options.temperature, engine.base_options.language,
               engine.modes, engine.languages)
        if key not in _PAGES:
            demo = real_build(engine)
            _PAGES[key] = [(c.get("props", {}).get("label"), c.get("props", {}).get("value"))
                           for c in demo.config["components"] if c.get("type") in ("dropdown", "slider")]
        controls = _PAGES[key]
        rec.put("controls", controls)
        choices = dict(controls)
        rec.put("session", engine.options(choices["Mode"], choices["Temperature"], choices["Language"]))
        rec.put("fallback", engine.fallback(choices["Temperature"]))
        engine.scheduler.close()
        return SimpleNamespace(launch=lambda **kw: rec.put("launch", kw))

    monkeypatch.setattr(ui_app, "build_app", build_app)
    monkeypatch.setattr(ports, "port_problem", lambda host, port: None if port > 1023 else "Permission denied")
    monkeypatch.setattr(ui_app.signal, "signal", lambda *a: None)
    monkeypatch.setattr(ui_app.logging, "basicConfig", lambda **kw: None)
    # asr-serve: the app's parts are recorded, with what a client leaving every field out decodes with (an
    # upload as api.py builds its options, a live session as live.py does); nothing is served
    monkeypatch.delenv("ASR_SERVE_API_KEY", raising=False)

    def build_service(engine, access, mount_ui=True):
        base = engine.base_options
        rec.put("engine", [engine.limits, engine.schedule, engine.live_encoder_context_s, engine.streaming])
        rec.put("access", [access, mount_ui])
        upload = serve_api.TranscriptionRequest("transcribe", "whisper-1", base.language, None, "json",
                                                base.temperature, (), False, None)
        rec.put("upload", [serve_api.decoding_options(engine, upload), engine.fallback(upload.temperature)])
        mode = base.mode if base.mode in engine.modes else engine.modes[0]
        live = engine.session_decoder(mode, base.temperature, base.language or "auto", live=True)
        rec.put("live", live.options)
        return SimpleNamespace(engine=engine)

    monkeypatch.setattr(serve_app, "build_app", build_service)
    monkeypatch.setattr(serve_cli, "warm_up", lambda engine: rec.put("warm_up", True))   # before serving
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: rec.put("uvicorn", kw))

    def start_on_ray(args, settings, options):  # asr-serve --engine ray: what ray_launch.start would deploy
        rec.put("ray", {"address": options.address, "cpus_needed": options.cpus_needed,
                        "scaling": options.scaling(),
                        "replica": [options.cpus_per_replica, options.gpus_per_replica, options.max_ongoing,
                                    options.batching],
                        "http": [args.host, args.port]})
        ingress = ray_engine.Ingress(None, None, args, settings)  # the deployments' bodies, built here
        ingress.__serve_build_asgi_app__()
        ray_engine.DecoderReplica(args).scheduler.close()  # what each replica loads (recorded last)

    monkeypatch.setattr(ray_engine, "ray_serve_problem", lambda: None)
    monkeypatch.setattr(ray_engine, "RemoteScheduler", FakeRemoteScheduler)
    monkeypatch.setattr(ray_engine, "_replica_name", lambda: "replica")  # without importing Ray Serve
    monkeypatch.setattr(ray_launch, "start", start_on_ray)
    monkeypatch.setattr(ray_launch, "serve_until_stopped", lambda options: None)
    monkeypatch.setattr(ray_launch, "stop_service", lambda options: None)
    return rec


MAINS = {T: transcribe_cli.main, S: stream_cli.main, E: eval_cli.main, A: ui_app.main, V: serve_cli.main}


def _workspace() -> Path:
    root = Path(tempfile.mkdtemp(prefix="front-end-"))
    clip = np.zeros(8000, np.float32)
    (root / "IN" / "sub").mkdir(parents=True)
    sf.write(root / "IN" / "a.flac", clip, 16000)
    sf.write(root / "IN" / "sub" / "b.flac", clip, 16000)
    sf.write(root / "AUDIO.flac", clip, 16000)
    (root / "DONE").mkdir()
    (root / "DONE" / "a.txt").write_text("done\n")
    return root


def run(front_end: str, argv: str, recorder: Recorder) -> tuple[int, dict, str]:
    """(exit status, what the run built, stderr), in a fresh folder."""
    root = _workspace()
    args = [str(root / (w + ".flac" if w == "AUDIO" else w)) if re.fullmatch(r"(IN|AUDIO|OUT|DONE)(/\S*)?", w)
            else w for w in argv.split()]
    recorder.clear()
    out, err = (TtyOut() if front_end == S else io.StringIO()), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = MAINS[front_end](args)
            except SystemExit as exc:
                code = exc.code
        files = {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
                 if p.is_file() and p.suffix != ".flac" and p.name != "a.txt"}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    trace = dict(recorder, stdout=out.getvalue(), files=files)
    return code, trace, err.getvalue().replace(str(root), "<root>")


# ---------------------------------------------------------------------------------------------- the probes
def _options(front_end: str) -> list[argparse.Action]:
    return [a for a in PARSERS[front_end]()._actions if not isinstance(a, argparse._HelpAction)]


def _auto_probe(action: argparse.Action) -> list[str]:
    """Probes for an option nobody listed: the flag, every other choice, or a changed value."""
    flag = action.option_strings[-1] if action.option_strings else None
    if flag is None:
        return []
    if action.nargs == 0:
        return [f"H:{flag}"]
    if action.nargs == "?" and action.const is not None:
        return [f"H:{flag}"]
    if action.choices:
        return [f"H:{flag} {c}" for c in action.choices if c != action.default]
    if action.type is int:
        return [f"H:{flag} {(action.default or 0) + 1}"]
    if action.type is float:
        return [f"H:{flag} {(action.default or 0) + 0.25:g}"]
    return [f"H:{flag} x"]


def probes(front_end: str) -> list[tuple[str, str, str, str]]:
    """(option dest, expectation H / H! / R, argv, baseline argv) for every option of a front end."""
    def full(words: str) -> str:
        words = words.strip()
        return words[1:].strip() if words.startswith("=") else f"{BASE_ARGV[front_end]} {words}".strip()

    out = []
    for action in _options(front_end):
        for spec in PROBES[front_end].get(action.dest) or _auto_probe(action):
            expect, rest = spec.split(":", 1)
            argv, _, baseline = rest.partition("|")
            out.append((action.dest, expect, full(argv), full(baseline)))
    return out


CASES = [(fe, *p) for fe in PARSERS for p in probes(fe)]


@pytest.mark.parametrize("front_end, dest, expect, argv, baseline", CASES,
                         ids=[f"{c[0]}:{c[1]}:{c[3]}" for c in CASES])
def test_every_option_is_honoured_or_refused(front_end, dest, expect, argv, baseline, recorder):
    code, trace, err = run(front_end, argv, recorder)
    if expect == "R":
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
        assert code == 2 and "Traceback" not in err, err
        assert len(lines) == 1 and "error" in lines[0], err  # one line says why (after argparse's usage)
        assert "load" not in trace, "refused only after loading the models"
        return
    assert code == 0, err
    if (front_end, baseline) not in _BASELINES:
        _BASELINES[front_end, baseline] = run(front_end, baseline, recorder)
    base_code, base_trace, base_err = _BASELINES[front_end, baseline]
    assert base_code == 0, base_err
    if expect == "H!":
        assert err != base_err, f"{front_end} {argv}: stderr unchanged"
        return
    keys = (set(trace) | set(base_trace)) - UNUSED.get(front_end, set())
    changed = sorted(k for k in keys if trace.get(k) != base_trace.get(k))
    assert changed, f"{front_end}: '{argv}' builds exactly what '{baseline}' builds: --{dest} is accepted and ignored"


def test_the_tables_name_only_real_options():
    for front_end, listed in PROBES.items():
        stale = set(listed) - {a.dest for a in _options(front_end)}
        assert not stale, (front_end, stale)


# Installed front ends whose options are enumerated elsewhere, and where; a new one must be added to PARSERS
# or here. asr-distill's options drive training, not decoding: its own tests build the run's options from
# every option and check each field is read by the recipe.
COVERED_ELSEWHERE = {
    "asr-distill": ("tests/test_distill.py", ("test_every_command_line_option_reaches_the_options",
                                               "test_every_option_field_is_read_by_the_recipe")),
}


def test_every_installed_front_end_is_enumerated():
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    missing = (set(scripts) | {"app.py"}) - set(PARSERS) - set(COVERED_ELSEWHERE)
    for path, tests in COVERED_ELSEWHERE.values():
        source = (REPO_ROOT / path).read_text()
        assert all(f"def {name}(" in source for name in tests), (path, tests)
    assert not missing, f"front end(s) {sorted(missing)}: add them to PARSERS, MAINS and the fakes here"
    assert {name: scripts[name] for name in PARSERS if name in scripts} == {
        T: "asr_app.cli.transcribe:main", S: "asr_app.cli.stream:main", E: "asr_app.eval.cli:main",
        V: "asr_app.serve.cli:main"}
    assert "asr_app.ui" in (REPO_ROOT / "app.py").read_text()


def test_the_probe_catches_an_ignored_option(recorder, monkeypatch):
    """The check itself can fail: an option added to asr-stream and wired nowhere is reported."""
    real = stream_cli.build_parser

    def with_unused_option():
        parser = real()
        parser.add_argument("--unused-knob", type=float, default=1.0)
        return parser

    monkeypatch.setattr(stream_cli, "build_parser", with_unused_option)
    [(dest, expect, argv, baseline)] = [p for p in probes(S) if p[0] == "unused_knob"]
    with pytest.raises(AssertionError, match="accepted and ignored"):
        test_every_option_is_honoured_or_refused(S, dest, expect, argv, baseline, recorder)
