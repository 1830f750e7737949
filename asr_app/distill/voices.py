"""Speaking voices for synthetic training speech: Debian's espeak-ng, flite and festival, each as 16 kHz audio.

espeak-ng speaks every language listed here with many variants, rates and pitches, but it is one
synthesiser: a draft trained on it alone learns its sound (docs/distill.md). flite's English voices and
festival's English, Italian and Russian voices are other synthesisers; a language's voices are drawn from
every engine asked for that speaks it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from asr_app.audio import SAMPLE_RATE

ESPEAK, FLITE, FESTIVAL = "espeak-ng", "flite", "festival"
ENGINES = (ESPEAK, FLITE, FESTIVAL)
# The program each engine runs, and the Debian packages that install it.
PROGRAMS = {ESPEAK: "espeak-ng", FLITE: "flite", FESTIVAL: "text2wave"}
PACKAGES = {ESPEAK: "espeak-ng", FLITE: "flite",
            FESTIVAL: "festival festvox-kallpc16k festvox-us-slt-hts festvox-itapc16k festvox-italp16k festvox-ru"}
FESTIVAL_VOICES_DIR = Path("/usr/share/festival/voices")

# Whisper's language code -> each engine's voices (espeak-ng: English in several accents).
VOICES: dict[str, dict[str, tuple[str, ...]]] = {
    "en": {ESPEAK: ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-029"),
           FLITE: ("kal16", "awb", "rms", "slt"), FESTIVAL: ("kal_diphone", "cmu_us_slt_arctic_hts")},
    "de": {ESPEAK: ("de",)}, "fr": {ESPEAK: ("fr",)}, "es": {ESPEAK: ("es", "es-419")},
    "it": {ESPEAK: ("it",), FESTIVAL: ("pc_diphone", "lp_diphone")},
    "ru": {ESPEAK: ("ru",), FESTIVAL: ("msu_ru_nsh_clunits",)},
    "pt": {ESPEAK: ("pt", "pt-br")}, "nl": {ESPEAK: ("nl",)}, "pl": {ESPEAK: ("pl",)},
}
# festival's Italian voices read ISO-8859-1 text (UTF-8 accents stop their letter-to-sound rules); others UTF-8.
FESTIVAL_ENCODING = {"pc_diphone": "latin-1", "lp_diphone": "latin-1"}
# Typographic marks ISO-8859-1 lacks, as the ASCII a voice reads them as (else it would be given "?").
PLAIN_MARKS = str.maketrans({"’": "'", "‘": "'", "“": '"', "”": '"', "„": '"', "–": "-", "—": "-", "…": "...",
                             "€": " euro "})
# festival voices with no rate control (clunits, HTS): they speak at their own rate whatever the stretch.
OWN_RATE = frozenset({"msu_ru_nsh_clunits", "cmu_us_slt_arctic_hts"})
# espeak-ng's voice variants that sound like people (its robots, whispers and croaks left out).
VARIANTS: tuple[str, ...] = (
    "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "f1", "f2", "f3", "f4", "f5", "klatt", "klatt2", "klatt3",
    "Andrea", "Alex", "Annie", "benjamin", "david", "edward", "linda", "max", "michel", "norbert", "steph",
    "travis", "victor")
NATURAL_WPM = 170  # the rate flite and festival speak at unstretched, roughly: a voice's wpm sets their stretch


class SynthError(RuntimeError):
    """A speech engine is missing or failed; the message says what to do."""


class SpeakError(SynthError):
    """An installed engine could not speak one sentence (festival's Italian voices, for one, give no audio
    for "45%"): that sentence is skipped, the rest go on."""


@dataclass(frozen=True)
class Voice:
    language: str     # Whisper's code
    voice: str        # the engine's voice name
    variant: str      # espeak-ng's variant; "" for the other engines
    wpm: int          # words per minute; 0: the voice's own rate (festival's voices in OWN_RATE)
    pitch: int        # 0-99 (espeak-ng; flite: the voice's mean pitch moved by (pitch - 50) / 2 Hz; festival: unused)
    engine: str = ESPEAK


def engine_available(engine: str) -> bool:
    return shutil.which(PROGRAMS[engine]) is not None


def voice_installed(engine: str, voice: str) -> bool:
    """Whether `engine` and its `voice` are installed here."""
    if not engine_available(engine):
        return False
    if engine != FESTIVAL:
        return True  # espeak-ng's and flite's voices come with the program
    return any(path.is_dir() for path in FESTIVAL_VOICES_DIR.glob(f"*/{voice}"))


def voices_for(language: str, engines: tuple[str, ...] = (ESPEAK,)) -> list[tuple[str, str]]:
    """(engine, voice) pairs that speak `language` among `engines`, installed here."""
    if language not in VOICES:
        raise ValueError(f"no voice listed for language '{language}'; known: {', '.join(VOICES)}")
    found = [(engine, voice) for engine in engines for voice in VOICES[language].get(engine, ())
             if voice_installed(engine, voice)]
    if not found:
        listed = [e for e in engines if VOICES[language].get(e)]
        hint = "; ".join(f"{e}: apt-get install {PACKAGES[e]}" for e in listed) or f"none of {', '.join(engines)} speaks it"
        raise SynthError(f"no installed voice speaks '{language}' ({hint})")
    return found


def random_voice(language: str, rng: np.random.Generator, wpm: tuple[int, int] = (115, 215),
                 pitch: tuple[int, int] = (15, 85), engines: tuple[str, ...] = (ESPEAK,)) -> Voice:
    """A voice for `language` drawn from `engines`, with a random rate, pitch and (espeak-ng) variant."""
    options = voices_for(language, engines)
    # Drawn as earlier releases drew an espeak-ng voice: with espeak-ng alone a seed still makes the same clips.
    engine, name = options[int(rng.choice(len(options)))]
    variant = str(rng.choice(VARIANTS))
    speed, height = int(rng.integers(wpm[0], wpm[1] + 1)), int(rng.integers(pitch[0], pitch[1] + 1))
    return Voice(language, name, variant if engine == ESPEAK else "", 0 if name in OWN_RATE else speed, height, engine)


def _espeak(text: str, voice: Voice, wav: Path) -> list[str]:
    # A file, not --stdout: the streamed WAV header has no length, which readers reject.
    return [ESPEAK, "-v", f"{voice.voice}+{voice.variant}", "-s", str(voice.wpm), "-p", str(voice.pitch),
            "-w", str(wav), "--", text]


def _flite(text: str, voice: Voice, wav: Path) -> list[str]:
    text_file = wav.with_suffix(".txt")
    text_file.write_text(text, encoding="utf-8")
    return [FLITE, "-voice", voice.voice, "-f", str(text_file), "-o", str(wav),
            "--setf", f"duration_stretch={NATURAL_WPM / voice.wpm:.3f}",
            "--setf", f"int_f0_target_mean={_flite_pitch(voice):.0f}"]


def _flite_pitch(voice: Voice) -> float:
    base = 170.0 if voice.voice == "slt" else 105.0  # slt is a woman's voice, the others men's
    return base + (voice.pitch - 50) / 2


def _festival(text: str, voice: Voice, wav: Path) -> list[str]:
    text_file = wav.with_suffix(".txt")
    encoding = FESTIVAL_ENCODING.get(voice.voice, "utf-8")
    try:
        text_file.write_bytes(text.translate(PLAIN_MARKS).encode(encoding))
    except UnicodeEncodeError as exc:
        raise SpeakError(f"festival voice {voice.voice} reads {encoding}, which cannot hold "
                         f"{exc.object[exc.start:exc.end]!r}") from exc
    command = ["text2wave", "-eval", f"(voice_{voice.voice})", "-o", str(wav), str(text_file)]
    if voice.wpm:
        command[3:3] = ["-eval", f"(Parameter.set 'Duration_Stretch {NATURAL_WPM / voice.wpm:.3f})"]
    return command


COMMANDS = {ESPEAK: _espeak, FLITE: _flite, FESTIVAL: _festival}


def synthesize(text: str, voice: Voice) -> np.ndarray:
    """`text` spoken by `voice` as 16 kHz mono float32."""
    if not engine_available(voice.engine):
        raise SynthError(f"{voice.engine} is not installed (Debian/Ubuntu: apt-get install {PACKAGES[voice.engine]})")
    with tempfile.TemporaryDirectory() as folder:
        wav = Path(folder) / "speech.wav"
        try:
            done = subprocess.run(COMMANDS[voice.engine](text, voice, wav), capture_output=True, text=True,
                                  timeout=60, errors="replace")
        except subprocess.TimeoutExpired as exc:
            raise SpeakError(f"{voice.engine} voice {voice.voice} took over 60 s") from exc
        if done.returncode != 0 or not wav.is_file() or wav.stat().st_size <= 44:  # 44: a WAV header alone
            said = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            raise SpeakError(f"{voice.engine} voice {voice.voice} gave no audio"
                             + (f": {said[-1][:200]}" if said else ""))
        samples, rate = sf.read(str(wav), dtype="float32", always_2d=True)
    if not samples.size:
        raise SpeakError(f"{voice.engine} voice {voice.voice} gave no audio")
    mono = samples.mean(axis=1)
    return soxr.resample(mono, rate, SAMPLE_RATE).astype(np.float32) if rate != SAMPLE_RATE else mono
