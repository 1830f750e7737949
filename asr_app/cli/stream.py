"""asr-stream: live transcription from the microphone, or a file played as if it were one.

    asr-stream                              # microphone
    asr-stream --simulate talk.flac         # the file at real-time pace
    asr-stream --simulate talk.flac --fast --jsonl

On a terminal the committed text grows and the unconfirmed tail is shown dimmed after it,
rewritten in place. Piped (or with --plain) only committed text is printed, one commit per
line; --jsonl prints every event as one JSON object per line. Ctrl-C stops listening, decodes
what is left and prints the last words before exiting.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TextIO

from asr_app.arguments import add_model_args, check_args_or_report, load_decoder_or_report
from asr_app.audio import AudioLoadError, FileSource, MicrophoneError, MicrophoneSource
from asr_app.cli.remote import RemoteError, RemoteOptions, stream_to_server
from asr_app.streaming import (
    EDGE_S,
    STEP_S,
    StreamEvent,
    StreamingOptions,
    StreamingProcessor,
    latency_report,
)

FRONTIER_S = StreamingOptions.frontier_s
# What a --server stream may set: the audio source and output here, mode/temperature/language at the server.
REMOTE_DESTS = {"help", "simulate", "fast", "block", "input_device", "jsonl", "plain", "stats", "server", "api_key",
                "mode", "temperature", "language"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asr-stream", description="Streaming speech recognition.")
    parser.add_argument("--simulate", metavar="FILE", help="stream this audio file instead of the microphone")
    parser.add_argument("--fast", action="store_true", help="with --simulate: as fast as possible, not real time")
    parser.add_argument("--step", type=float, default=STEP_S, metavar="S",
                        help="decode again as soon as the previous decode is done and S seconds of new audio "
                             f"arrived (default {STEP_S})")
    parser.add_argument("--policy", choices=("local-agreement", "alignatt"), default="local-agreement",
                        help="when words become final: two consecutive hypotheses agree (local-agreement, "
                             "default) or the target's attention has moved past them (alignatt)")
    parser.add_argument("--frontier", type=float, default=None, metavar="S",
                        help="alignatt: a word is final once it ends S seconds before the newest audio (default "
                             f"{FRONTIER_S})")
    parser.add_argument("--edge", type=float, default=None, metavar="S",
                        help="local-agreement: an agreed word is final once it also ends S seconds before the newest "
                             f"audio (default {EDGE_S}; 0 = plain LocalAgreement-2)")
    parser.add_argument("--block", type=float, default=0.1, help="audio block size in seconds (default 0.1)")
    parser.add_argument("--input-device", default=None, help="sounddevice input device (index or name)")
    parser.add_argument("--vad_filter", "--vad-filter", action="store_true",
                        help="treat audio Silero VAD finds no speech in as silence (the vad extra)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--jsonl", action="store_true", help="print every event as a JSON line")
    output.add_argument("--plain", action="store_true",
                        help="only final text, one line per sentence or pause (the default when piped)")
    parser.add_argument("--stats", action="store_true", help="print latency/RTF statistics to stderr at the end")
    parser.add_argument("--server", metavar="URL", default=None,
                        help="stream to a running asr-serve (http://host:port, or the same ending in /v1) instead of "
                             "decoding here; --mode, --temperature and --language go to the server, which decides "
                             "everything else")
    parser.add_argument("--api-key", default=os.environ.get("ASR_SERVE_API_KEY"),
                        help="with --server: the server's API key (default: $ASR_SERVE_API_KEY)")
    add_model_args(parser, no_fallback="asr-stream decodes the growing buffer again every step and commits "
                                       "what the decodes agree on, so it has no failed window to decode again")
    return parser


SENTENCE_END = (".", "?", "!", "。", "？", "！")
PAUSE_S = 0.8  # a gap this long in the audio between committed words ends a plain-output line
IDLE_S = 2.0   # this much audio after the line's last word with nothing being recognised ends it too


class SentenceLines:
    """Committed words -> whole lines: one per sentence, or per pause when speech stops unpunctuated."""

    def __init__(self, pause_s: float = PAUSE_S, idle_s: float = IDLE_S) -> None:
        self.pause_s, self.idle_s = pause_s, idle_s
        self.words: list = []

    def add(self, words) -> list[str]:
        lines = []
        for word in words:
            if self.words and word.start - self.words[-1].end >= self.pause_s:
                lines.append(self._take())
            self.words.append(word)
            if word.text.endswith(SENTENCE_END):
                lines.append(self._take())
        return lines

    def idle(self, audio_now: float, speech_pending: bool) -> list[str]:
        """Audio went on and nothing after the line's last word is being recognised (`speech_pending`:
        an unconfirmed tail exists): after `idle_s` (longer than a commit policy's lag) the line ends."""
        if self.words and not speech_pending and audio_now - self.words[-1].end >= self.idle_s:
            return [self._take()]
        return []

    def close(self) -> list[str]:
        return [self._take()] if self.words else []

    def _take(self) -> str:
        line, self.words = " ".join(w.text for w in self.words), []
        return line


class Printer:
    """Renders events as JSON lines, plain lines (one per sentence or pause), or an in-place updated
    terminal line."""

    def __init__(self, out: TextIO, style: str):
        self.out, self.style = out, style
        self._tail_shown = False
        self.lines = SentenceLines()
        self._tail = ""  # the unconfirmed words the processor shows now

    def __call__(self, events: list[StreamEvent], audio_now: float | None = None) -> None:
        for event in events:
            if self.style == "jsonl":
                self.out.write(json.dumps(event.to_dict()) + "\n")
            elif self.style == "plain":
                if event.kind == "commit":
                    self._write_lines(self.lines.add(event.words))
                else:
                    self._tail = event.text
            else:
                self._terminal(event)
        if self.style == "plain" and audio_now is not None:
            self._write_lines(self.lines.idle(audio_now, speech_pending=bool(self._tail.strip())))
        self.out.flush()

    def _write_lines(self, lines: list[str]) -> None:
        for line in lines:
            self.out.write(line + "\n")

    def _terminal(self, event: StreamEvent) -> None:
        if self._tail_shown:
            self.out.write("\x1b[u\x1b[J")  # back to where the tail began, erase it
            self._tail_shown = False
        if event.kind == "commit" and event.text:
            self.out.write(event.text + " ")
        elif event.kind == "partial" and event.text:
            self.out.write("\x1b[s\x1b[2m" + event.text + "\x1b[0m")
            self._tail_shown = True

    def close(self) -> None:
        if self.style == "plain":
            self._write_lines(self.lines.close())
        if self.style == "terminal":
            if self._tail_shown:
                self.out.write("\x1b[u\x1b[J")
            self.out.write("\n")
        self.out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.fast and not args.simulate:
        parser.error("--fast needs --simulate FILE")
    if args.step <= 0 or args.block <= 0:
        parser.error("--step and --block must be positive")
    if args.input_device is not None and args.simulate:
        parser.error("--input-device picks the microphone; --simulate reads a file instead")
    if args.frontier is not None and args.policy != "alignatt":
        parser.error("--frontier is the alignatt policy's: add --policy alignatt")
    if args.edge is not None and args.policy == "alignatt":
        parser.error("--edge is the local-agreement policy's, not alignatt's (which uses --frontier)")
    if args.server:
        local = [a.option_strings[0] for a in parser._actions
                 if a.dest not in REMOTE_DESTS and a.option_strings and getattr(args, a.dest) != a.default]
        if local:
            parser.error(f"{', '.join(local)}: decided by the server with --server; leave "
                         f"{'them' if len(local) > 1 else 'it'} out")
    elif args.api_key != parser.get_default("api_key"):
        parser.error("--api-key is for --server")
    args.frontier = FRONTIER_S if args.frontier is None else args.frontier
    args.edge = EDGE_S if args.edge is None else args.edge
    if args.edge < 0 or args.frontier < 0:
        parser.error("--edge and --frontier must be >= 0")
    if not check_args_or_report(args, "asr-stream"):
        return 2

    try:
        if args.simulate:
            source = FileSource(args.simulate, block_s=args.block, realtime=not args.fast)
        else:
            device = int(args.input_device) if (args.input_device or "").isdigit() else args.input_device
            source = MicrophoneSource(block_s=args.block, device=device)
    except (AudioLoadError, MicrophoneError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    style = "jsonl" if args.jsonl else "plain" if (args.plain or not sys.stdout.isatty()) else "terminal"
    if args.server:
        return run_remote(args, source, Printer(sys.stdout, style))
    decoder = load_decoder_or_report(args, "asr-stream")  # the models load once, here
    if decoder is None:
        return 2
    printer = Printer(sys.stdout, style)
    try:
        processor = StreamingProcessor(decoder, StreamingOptions(step_s=args.step, vad_filter=args.vad_filter,
                                                                 policy=args.policy, frontier_s=args.frontier,
                                                                 edge_s=args.edge))
    except RuntimeError as exc:  # the vad extra is missing
        print(f"asr-stream: error: {exc}", file=sys.stderr)
        return 2
    events: list[StreamEvent] = []
    if not args.simulate:
        print(f"listening on {source.device_name} (Ctrl-C to stop)", file=sys.stderr)
    started = time.perf_counter()
    try:
        for block in source:
            processor.insert_audio(block)
            new = processor.process()
            if args.stats:   # kept only for the statistics: a microphone may stream for hours
                events.extend(new)
            printer(new, processor.audio_seconds)
    except KeyboardInterrupt:
        pass  # stop listening; the words still in the buffer are flushed below
    except MicrophoneError as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
    try:
        final = processor.finish()
    except KeyboardInterrupt:  # a second Ctrl-C: give up on the last words
        printer.close()
        return 130
    events.extend(final)
    printer(final)
    printer.close()
    overflows = report_overflows(source)
    if args.stats:
        report = latency_report(events, processor.audio_seconds, processor.compute_s)
        report["audio_s"] = round(processor.audio_seconds, 2)
        report["microphone_overflows"] = overflows
        report["prompt_retries"] = processor.prompt_retries
        report["wall_s"] = round(time.perf_counter() - started, 2)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in report.items()}),
              file=sys.stderr)
    return 0


def run_remote(args: argparse.Namespace, source, printer: Printer) -> int:
    """Stream `source` to the server, print its events; the server's statistics with --stats."""
    options = RemoteOptions(args.server, args.api_key, args.mode, float(args.temperature[0]),
                            args.language or "auto")
    if not args.simulate:
        print(f"listening on {source.device_name}, streaming to {args.server} (Ctrl-C to stop)", file=sys.stderr)
    try:
        stats = stream_to_server(options, source, printer)
    except RemoteError as exc:
        printer.close()
        print(f"asr-stream: error: {exc}", file=sys.stderr)
        return 2
    printer.close()
    overflows = report_overflows(source)
    if args.stats:
        print(json.dumps({**stats, "microphone_overflows": overflows}), file=sys.stderr)
    return 0


def report_overflows(source) -> int:
    """Say when the microphone's buffer overflowed (audio was lost before it reached us); the count."""
    overflows = int(getattr(source, "dropped_overflows", 0))
    if overflows:
        print(f"asr-stream: warning: the microphone overflowed {overflows} time(s), so some audio was lost "
              "before it could be transcribed (a busy machine; try a larger --block)", file=sys.stderr)
    return overflows


if __name__ == "__main__":
    sys.exit(main())
