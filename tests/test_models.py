"""Model loading: local directories, hub ids from an offline cache, shared-encoder detection, checks."""

from __future__ import annotations

import copy
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import DISTIL_DRAFT_DIR, REPO_ROOT, TINY_EN_DIR
from transformers import WhisperConfig, WhisperForCausalLM, WhisperForConditionalGeneration, WhisperProcessor

from asr_app.models import PRESETS, ModelLoadError, derive_draft, detect_shared_encoder, load_pair
from asr_app.models.device import resolve_draft_dtype, resolve_dtype
from asr_app.models.loading import check_pair


def small_whisper(vocab: int = 51864, d_model: int = 16, layers: int = 1, seed: int = 0):
    torch.manual_seed(seed)
    config = WhisperConfig(vocab_size=vocab, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                           decoder_ffn_dim=32, max_source_positions=1500, max_target_positions=448)
    return WhisperForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def real_pair():
    return load_pair(target=str(TINY_EN_DIR), draft=str(DISTIL_DRAFT_DIR), device="cpu")


def test_load_real_pair_from_directories(real_pair):
    assert isinstance(real_pair.target, WhisperForConditionalGeneration)
    assert isinstance(real_pair.draft, WhisperForCausalLM)
    assert real_pair.shared_encoder  # decoder-only draft runs on the target's encoder output
    # the checkpoints are float16; on CPU the default is float32 (fp16 convolutions fail there)
    assert real_pair.dtype == torch.float32 and next(real_pair.target.parameters()).dtype == torch.float32
    assert next(real_pair.draft.parameters()).dtype == torch.float32 == real_pair.draft_dtype
    assert real_pair.device == torch.device("cpu")
    assert real_pair.processor.tokenizer.eos_token_id == real_pair.target.config.eos_token_id
    assert real_pair.target_name == str(TINY_EN_DIR) and real_pair.draft_name == str(DISTIL_DRAFT_DIR)


def test_draft_dtype(real_pair):
    cpu = torch.device("cpu")
    # the default is the target's dtype; any dtype can be asked for
    assert resolve_draft_dtype(None, cpu, torch.float32) == torch.float32
    assert resolve_draft_dtype("auto", torch.device("cuda"), torch.float16) == torch.float16
    assert resolve_draft_dtype("same", cpu, torch.float32) == torch.float32
    assert resolve_draft_dtype("bf16", cpu, torch.float32) == torch.bfloat16
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        resolve_draft_dtype("int4", cpu, torch.float32)
    assert real_pair.draft_dtype == next(real_pair.draft.parameters()).dtype == real_pair.draft_compute_dtype
    bf16 = load_pair(target=str(TINY_EN_DIR), draft=str(DISTIL_DRAFT_DIR), device="cpu", draft_dtype="bfloat16")
    assert next(bf16.draft.parameters()).dtype == torch.bfloat16 and bf16.draft_dtype == torch.bfloat16
    assert next(bf16.target.parameters()).dtype == torch.float32 and bf16.shared_encoder
    derived = load_pair(target=str(TINY_EN_DIR), draft="derived", device="cpu", draft_dtype="bfloat16")
    # the derived draft holds copies: casting it leaves the target in fp32
    assert next(derived.draft.parameters()).dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in derived.target.parameters())
    assert load_pair(target=str(TINY_EN_DIR), draft=None, device="cpu").draft_dtype is None


def test_target_only_and_derived(real_pair):
    only = load_pair(target=str(TINY_EN_DIR), draft=None, device="cpu")
    assert only.draft is None and not only.shared_encoder
    assert load_pair(target=str(TINY_EN_DIR), draft="none", device="cpu").draft is None
    derived = load_pair(target=str(TINY_EN_DIR), draft="derived", device="cpu")
    assert isinstance(derived.draft, WhisperForCausalLM) and derived.shared_encoder
    assert derived.draft.config.decoder_layers == 2


def test_derive_draft_copies_layers_and_leaves_target_config(real_pair):
    target = real_pair.target
    draft = derive_draft(target, layers=(0, 3))
    assert target.config.is_encoder_decoder  # WhisperForCausalLM mutates the config it is given
    src, dst = target.model.decoder, draft.model.decoder
    for new, old in enumerate((0, 3)):
        for (name, a), (_, b) in zip(src.layers[old].state_dict().items(), dst.layers[new].state_dict().items()):
            assert torch.equal(a, b), name
    assert torch.equal(draft.proj_out.weight, target.proj_out.weight)
    with pytest.raises(ValueError, match="subset"):
        derive_draft(target, layers=(0, 9))


def test_shared_encoder_detection_checks_weights():
    target = small_whisper()
    same = copy.deepcopy(target)
    assert detect_shared_encoder(target, same)
    other = copy.deepcopy(target)
    with torch.no_grad():
        other.model.encoder.layers[0].fc1.weight[0, 0] += 1e-3
    assert not detect_shared_encoder(target, other)
    assert detect_shared_encoder(target, derive_draft(target, layers=(0,)))
    assert not detect_shared_encoder(target, None)


def test_vocabulary_mismatch_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="vocabulary mismatch.*51866.*large-v3.*51865"):
        check_pair(small_whisper(vocab=51866), small_whisper(vocab=51865), "openai/whisper-large-v3",
                   "distil-whisper/distil-large-v2")


def test_vocabulary_mismatch_from_directories(tmp_path, real_pair):
    draft_dir = tmp_path / "multilingual-draft"
    small_whisper(vocab=51865).save_pretrained(draft_dir)
    with pytest.raises(ModelLoadError, match="vocabulary mismatch"):
        load_pair(target=str(TINY_EN_DIR), draft=str(draft_dir), device="cpu")


def _broken_copy(source, folder, drop=(), edit=None):
    """A copy of a model folder without the files in `drop`, its config.json edited by `edit` (a dict of keys
    to set, or a string to write in its place)."""
    import json
    import shutil

    shutil.copytree(source, folder, ignore=shutil.ignore_patterns(*drop) if drop else None)
    if isinstance(edit, str):
        (folder / "config.json").write_text(edit)
    elif edit:
        (folder / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()), **edit}))
    return str(folder)


def test_a_broken_model_folder_is_one_sentence_that_says_what_is_wrong(tmp_path):
    """A folder that is there but broken is never called "not found"; a target without its tokenizer files
    is refused (transformers still builds a tokenizer of one entry, and every transcript came out empty
    with exit 0); weights that do not fit an edited config.json say so in a sentence (after transformers'
    load report, which is kept: it is also the only notice of weights missing from a file)."""
    cases = [
        (dict(target=_broken_copy(TINY_EN_DIR, tmp_path / "no-tokenizer", drop=("tokenizer*", "vocab.json",
                                                                               "merges.txt")), draft=None),
         "has no usable tokenizer: it knows 1 tokens against the model's 51864"),
        (dict(target=_broken_copy(TINY_EN_DIR, tmp_path / "bad-json", edit="{not json"), draft=None),
         "model folder '.*bad-json' cannot be read: .*not a valid JSON file"),
        (dict(target=_broken_copy(TINY_EN_DIR, tmp_path / "no-weights", drop=("*.safetensors", "*.bin")),
              draft=None), "model folder '.*no-weights' cannot be read: .*no file named model.safetensors"),
        (dict(target=str(TINY_EN_DIR), draft=_broken_copy(DISTIL_DRAFT_DIR, tmp_path / "edited",
                                                         edit={"vocab_size": 51865})),
         "its weights do not have the shapes its config.json gives"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ModelLoadError, match=message) as caught:
            load_pair(device="cpu", **kwargs)
        assert "not found" not in str(caught.value)


def test_draft_larger_than_target_warns():
    with pytest.warns(UserWarning, match="not smaller than target"):
        check_pair(small_whisper(d_model=16), small_whisper(d_model=32), "small", "big")


def test_bad_names_and_options():
    with pytest.raises(ModelLoadError, match="unknown pair 'tiny'.*small.en"):
        load_pair(pair="tiny")
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_pair(target="/nonexistent/whisper-dir", draft=None)
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        load_pair(target=str(TINY_EN_DIR), dtype="float8")
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert resolve_dtype(None, torch.device("cuda")) == torch.float16
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    assert PRESETS["large-v3"].draft == "distil-whisper/distil-large-v3"
    assert set(PRESETS) == {"tiny.en", "base", "small.en", "medium.en", "large-v2", "large-v3"}
    assert PRESETS["tiny.en"].draft == "bundled"


def test_hub_id_from_offline_cache_and_missing_id(tmp_path):
    """Build a Hugging Face cache (models--openai--whisper-tiny.en/snapshots/<rev>, refs/main) from the
    test model folder and load it by hub id with HF_HUB_OFFLINE=1 in a fresh process (the hub library reads
    HF_HUB_CACHE at import); an id that is not cached gives the clear error."""
    rev = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--openai--whisper-tiny.en"
    snapshot = repo / "snapshots" / rev
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    for f in TINY_EN_DIR.iterdir():
        (snapshot / f.name).symlink_to(f)
    script = textwrap.dedent("""
        from asr_app.models import ModelLoadError, load_pair
        pair = load_pair(target="openai/whisper-tiny.en", device="cpu")
        print("LOADED", type(pair.target).__name__, pair.target_name, pair.draft_name, pair.target.config.vocab_size)
        try:
            load_pair(target="openai/whisper-small.en", device="cpu")
        except ModelLoadError as err:
            print("ERROR", err)
    """)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub"), PYTHONPATH=str(REPO_ROOT))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # tiny.en's preset draft is the one shipped in the package
    assert "LOADED WhisperForConditionalGeneration openai/whisper-tiny.en bundled distil-tiny.en draft 51864" in out.stdout
    error = out.stdout.split("ERROR", 1)[1]
    assert "openai/whisper-small.en" in error and "HF_HUB_OFFLINE" in error and "local directory" in error


def test_a_bundled_drafts_target_loaded_in_bfloat16_is_told_which_dtype_to_use(tiny_en_pair):
    """The draft is matched by the target's float16 embedding, which bfloat16 rounds away: the refusal says so
    (not "a different model") and names the way out."""
    from asr_app.models.bundled import load_bundled_draft

    target = copy.deepcopy(tiny_en_pair.target).to(torch.bfloat16)
    with pytest.raises(ModelLoadError, match="loaded in bfloat16.*--dtype float16 or float32"):
        load_bundled_draft(target)


def test_bundled_draft_joins_tiny_en_and_refuses_other_targets(tiny_en_pair, tmp_path):
    from asr_app.models.bundled import bundle_for, is_tiny_en, load_bundled_draft

    target = tiny_en_pair.target
    draft = load_bundled_draft(target)
    assert is_tiny_en(target) and draft.config.decoder_layers == 2
    decoder = draft.get_decoder()
    assert torch.equal(decoder.embed_tokens.weight, target.get_decoder().embed_tokens.weight)
    assert draft.proj_out.weight.data_ptr() == decoder.embed_tokens.weight.data_ptr()  # tied, as trained
    # its layers are its own (distilled), not copies of tiny.en's layers 0 and 3
    assert not torch.equal(decoder.layers[0].fc1.weight, target.get_decoder().layers[0].fc1.weight)
    with pytest.raises(ModelLoadError, match="distilled from Whisper base and Whisper tiny.en"):
        load_bundled_draft(small_whisper())
    assert bundle_for(small_whisper()) is None and bundle_for(target).name == "distil-tiny.en-draft"
    other = tmp_path / "other-whisper"
    small_whisper().save_pretrained(other)
    WhisperProcessor.from_pretrained(TINY_EN_DIR).save_pretrained(other)
    with pytest.raises(ModelLoadError, match="distilled from Whisper base and Whisper tiny.en"):
        load_pair(target=str(other), draft="bundled", device="cpu")
    assert load_pair(target=str(other), device="cpu").draft is None  # "auto" for an unknown target: none
    pair = load_pair(target=str(TINY_EN_DIR), draft="bundled", device="cpu")
    assert pair.draft_name == "bundled distil-tiny.en draft" and pair.shared_encoder


def test_a_half_precision_model_on_a_cpu_is_told_it_is_slower_and_what_to_use(caplog):
    from asr_app.models import load_pair

    with caplog.at_level(logging.WARNING, logger="asr_app.models.loading"):
        pair = load_pair(target=str(TINY_EN_DIR), draft="none", device="cpu", dtype="bfloat16")
    assert pair.dtype == torch.bfloat16
    assert "slower than float32" in caplog.text and "--encoder-matmul-dtype bfloat16" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="asr_app.models.loading"):
        load_pair(target=str(TINY_EN_DIR), draft="none", device="cpu", dtype="float32")
    assert "slower than float32" not in caplog.text
