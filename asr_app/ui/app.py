"""The Gradio app: Live (microphone), File and Compare tabs over one model pair per process.

`build_app(engine)` only wires components to the plain handler functions in `live` and `file`
(which the tests call directly); `main()` is what `python app.py` runs.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence

import gradio as gr
import pandas as pd

from asr_app import ports
from asr_app.arguments import add_model_args, check_args_or_report, load_decoder_or_report
from asr_app.kernel_cache import add_kernel_cache_arg, bound_kernel_cache, kernel_cache_problem
from asr_app.ui.engine import COMPARE_MODES, UI_MODES, UiEngine
from asr_app.ui.file import CompareOutcome, compare_modes, transcribe_file
from asr_app.ui.live import live_chunk, live_figures_markdown, live_reset, live_stop
from asr_app.ui.page_script import LIVE_MIC_ID, RECORDER_RETRY_HEAD
from asr_app.ui.text import DIFF_CHANGED, DIFF_MISSING, live_transcript_html

log = logging.getLogger(__name__)

STREAM_EVERY_S = 0.5          # how often the browser sends a microphone chunk
COMPARE_TABLE_HEADERS = ["mode", "WER", "latency (s)", "acceptance", "verify (ms)", "verify steps",
                         "words differing"]
DIFF_COLORS = {DIFF_CHANGED: "#f4a261", DIFF_MISSING: "#e76f51"}


def header_markdown(engine: UiEngine) -> str:
    info = engine.describe()
    return (
        "# Speculative Whisper: streaming speech recognition\n"
        f"**Target:** `{info['target']}` &nbsp;·&nbsp; **Draft:** `{info['draft']}` &nbsp;·&nbsp; "
        f"**Device:** `{info['device']}` ({info['dtype']})"
    )


def _default_mode(engine: UiEngine) -> str:
    preferred = engine.base_options.mode
    return preferred if preferred in engine.modes else ("exact" if "exact" in engine.modes else engine.modes[0])


def _default_language(engine: UiEngine) -> str:
    """The launch's --language where the model offers it; else the first choice (auto, or en)."""
    chosen = engine.base_options.language
    return chosen if chosen in engine.languages else engine.languages[0]


def _message_markdown(message: str) -> str:
    return f"**{message}**" if message else ""


def _compare_chart(outcome: CompareOutcome) -> pd.DataFrame:
    return pd.DataFrame(outcome.chart_rows(), columns=["mode", "part", "seconds"])


def _live_tab(engine: UiEngine, default_mode: str) -> None:
    def on_live_chunk(chunk, session, mode, temperature, language="auto"):
        return live_chunk(engine, chunk, session, mode, temperature, language)

    def on_live_stop(session):
        return live_stop(engine, session)

    live_state = gr.State(None)
    with gr.Row():
        live_mode = gr.Dropdown(list(engine.modes), value=default_mode, label="Mode")
        live_temperature = gr.Slider(0.0, 1.0, value=engine.base_options.temperature, step=0.1, label="Temperature")
        live_language = gr.Dropdown(list(engine.languages), value=_default_language(engine), label="Language")
    mic = gr.Audio(sources=["microphone"], type="numpy", streaming=True, label="Microphone", elem_id=LIVE_MIC_ID)
    live_text = gr.HTML(live_transcript_html("", ""), label="Transcript")
    live_figures = gr.Markdown(live_figures_markdown(None))
    live_outputs = [live_state, live_text, live_figures]
    # A recording is one long-running stream event that holds its worker slot until the recording stops,
    # so live events get no concurrency limit (a limit of 1 would let only one person record at a time).
    # Chunks of one recording arrive in order in that one event; the handler only queues them for the
    # session's own decoding thread.
    mic.start_recording(live_reset, outputs=live_outputs, api_visibility="private", concurrency_limit=None)
    mic.stream(on_live_chunk, inputs=[mic, live_state, live_mode, live_temperature, live_language],
               outputs=live_outputs, stream_every=STREAM_EVERY_S, time_limit=None, show_progress="hidden",
               api_name="live_chunk", concurrency_limit=None)
    mic.stop_recording(on_live_stop, inputs=[live_state], outputs=live_outputs, api_name="live_stop",
                       concurrency_limit=None)


def _file_tab(engine: UiEngine, default_mode: str) -> None:
    def on_transcribe(path, mode, temperature, language="auto"):
        outcome = transcribe_file(engine, path, mode, temperature, language)
        return (_message_markdown(outcome.message), outcome.text, outcome.segments,
                outcome.files or None, outcome.stats or None, outcome.words)

    with gr.Row():
        file_audio = gr.Audio(sources=["upload", "microphone"], type="filepath", label="Audio clip")
        with gr.Column():
            file_mode = gr.Dropdown(list(engine.modes), value=default_mode, label="Mode")
            file_temperature = gr.Slider(0.0, 1.0, value=engine.base_options.temperature, step=0.1, label="Temperature")
            file_language = gr.Dropdown(list(engine.languages), value=_default_language(engine), label="Language")
            file_button = gr.Button("Transcribe", variant="primary")
    file_message = gr.Markdown()
    file_text = gr.Textbox(label="Transcript", lines=4)
    file_segments = gr.Dataframe(headers=["start (s)", "end (s)", "text"], label="Segments", interactive=False)
    file_downloads = gr.File(label="Subtitles and JSON", file_count="multiple")
    file_stats = gr.JSON(label="Decoding stats")
    file_words = gr.Dataframe(headers=["word", "start (s)", "end (s)", "probability"],
                              label="Words (times from the target's cross-attention)", interactive=False)
    file_button.click(on_transcribe, inputs=[file_audio, file_mode, file_temperature, file_language],
                      outputs=[file_message, file_text, file_segments, file_downloads, file_stats, file_words],
                      api_name="transcribe_file")


def _compare_tab(engine: UiEngine) -> None:
    def on_compare(path, reference, temperature):
        outcome = compare_modes(engine, path, reference, temperature)
        by_mode = {run.mode: run for run in outcome.runs}
        texts = [by_mode[m].highlighted if m in by_mode else None for m in COMPARE_MODES]
        status = outcome.message
        if outcome.runs:
            status = f"Highlights show words that differ from {outcome.anchor}. {status}".strip()
        return (_message_markdown(status), *texts, outcome.table(), _compare_chart(outcome))

    with gr.Row():
        compare_audio = gr.Audio(sources=["upload", "microphone"], type="filepath", label="Audio clip")
        with gr.Column():
            compare_reference = gr.Textbox(label="Reference text (optional, for WER)", lines=3)
            compare_temperature = gr.Slider(0.0, 1.0, value=1.0, step=0.1,
                                            label="Temperature (sampling is where the modes differ)")
            compare_button = gr.Button("Compare exact / sigmoid / baseline", variant="primary")
    compare_message = gr.Markdown()
    with gr.Row():
        compare_texts = [gr.HighlightedText(label=mode, color_map=DIFF_COLORS, show_legend=True,
                                            combine_adjacent=False) for mode in COMPARE_MODES]
    compare_table = gr.Dataframe(headers=COMPARE_TABLE_HEADERS, label="Figures", interactive=False)
    compare_chart = gr.BarPlot(x="mode", y="seconds", color="part", title="Decoding time per mode",
                               y_title="seconds", height=260)
    compare_button.click(on_compare, inputs=[compare_audio, compare_reference, compare_temperature],
                         outputs=[compare_message, *compare_texts, compare_table, compare_chart], api_name="compare")


def build_app(engine: UiEngine) -> gr.Blocks:
    """The page: a header naming the models, then the Live, File and Compare tabs."""
    default_mode = _default_mode(engine)
    # Uploads and results in Gradio's cache are deleted an hour after they were made (checked hourly).
    with gr.Blocks(title="Speculative Whisper ASR", analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(header_markdown(engine), elem_id="asr-header")
        with gr.Tabs():
            with gr.Tab("Live", id="live"):
                _live_tab(engine, default_mode)
            with gr.Tab("File", id="file"):
                _file_tab(engine, default_mode)
            with gr.Tab("Compare", id="compare"):
                _compare_tab(engine)
    # Several sessions may run at once; their decodes share batches in the engine's scheduler.
    demo.queue(default_concurrency_limit=4)
    return demo


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python app.py",
        description="Web demo: live microphone transcription, file transcription and a mode comparison. "
                    "--mode, --temperature and --language set the tabs' starting choices (Compare starts at "
                    "temperature 1.0, where the modes differ); a --temperature list is the File and Compare tabs' "
                    "fallback schedule.",
    )
    add_model_args(parser)
    parser.set_defaults(modes=UI_MODES)  # every mode is offered at once (--alpha/--beta are sigmoid's)
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0 for every one)")
    parser.add_argument("--port", type=int, default=7860, help="port to listen on")
    parser.add_argument("--share", action="store_true", help="also open a public gradio.live link (off by default)")
    parser.add_argument("--max-upload-mb", type=int, default=200,
                        help="largest upload accepted, in MB (default 200; Gradio refuses larger ones with a message)")
    add_kernel_cache_arg(parser)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.mode not in UI_MODES:
        print(f"app.py: error: --mode {args.mode} is not offered in the web app (choose from {', '.join(UI_MODES)})",
              file=sys.stderr)
        return 2
    if (problem := kernel_cache_problem(args.cpu_kernel_cache)) is not None:
        print(f"app.py: error: {problem}", file=sys.stderr)
        return 2
    if not check_args_or_report(args, "app.py"):
        return 2
    problem = ports.port_problem(args.host, args.port)
    if problem:  # say so before spending time on loading the models
        print(f"error: cannot serve on {args.host}:{args.port}: {problem}", file=sys.stderr)
        return 2
    kernel_cache = bound_kernel_cache(args.cpu_kernel_cache)   # before any kernel: the models load next
    decoder = load_decoder_or_report(args, "app.py")  # the models load once, here
    if decoder is None:
        return 2
    engine = UiEngine.from_decoder(decoder).sharing(schedule=args.temperature if len(args.temperature) > 1 else ())
    demo = build_app(engine)
    print(f"models loaded: {engine.describe()}{kernel_cache.startup_note(decoder.pair.device.type)}", flush=True)
    # SIGTERM stops the app as Ctrl-C does: Gradio then closes its server, which deletes its upload cache, and
    # the process ends normally, so the atexit cleanup of our own folders runs too.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        demo.launch(server_name=args.host, server_port=args.port, share=args.share, ssr_mode=False,
                    footer_links=["api"], max_file_size=f"{args.max_upload_mb}mb", head=RECORDER_RETRY_HEAD)
    except OSError as err:  # port taken, address not available, ...
        print(f"error: cannot serve on {args.host}:{args.port}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:   # stopped while it was still starting
        demo.close()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)   # a second SIGTERM during the cleanup just ends it
        clear_upload_cache(demo)
    return 0


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def clear_upload_cache(demo) -> None:
    """Delete what this app put in Gradio's cache (uploads, results). Gradio does so when its server's lifespan
    ends, which the app's shutdown did not reach (seen: every upload left behind, on Ctrl-C and SIGTERM), nor
    does a Gradio app mounted in asr-serve's FastAPI app have a lifespan of its own."""
    try:
        from gradio.route_utils import delete_files_created_by_app

        delete_files_created_by_app(demo, age=None)
    except Exception as exc:  # noqa: BLE001 - a cleanup at exit must not turn a clean stop into a traceback
        log.warning("Gradio's cache could not be cleared: %s", exc)


if __name__ == "__main__":
    sys.exit(main())
