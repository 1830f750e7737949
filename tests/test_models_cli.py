"""asr_app.arguments: the shared model/decoding arguments and the decoder they build."""

from __future__ import annotations

import argparse

import pytest
from conftest import TINY_EN_DIR

from asr_app.arguments import add_model_args, decoder_from_args, parse_gamma
from asr_app.decoding import RuntimeOptions
from asr_app.models import ModelLoadError


def parse(*argv: str) -> argparse.Namespace:
    return add_model_args(argparse.ArgumentParser()).parse_args(list(argv))


def test_arguments_and_defaults():
    args = parse()
    assert (args.pair, args.target, args.draft, args.mode, args.temperature, args.gamma) == (
        None, None, "auto", "exact", (0.0,), "auto")
    assert parse("--gamma", "3").gamma == 3 and parse("--gamma", "heuristic").gamma == "heuristic"
    with pytest.raises(argparse.ArgumentTypeError):
        parse_gamma("0")
    with pytest.raises(SystemExit):
        parse("--mode", "turbo")


def test_decoder_from_args_builds_the_pair_and_options():
    decoder = decoder_from_args(parse("--target", str(TINY_EN_DIR), "--draft", "derived", "--mode", "sigmoid",
                                      "--gamma", "4", "--alpha", "-10", "--beta", "10", "--seed", "7"))
    o = decoder.options
    assert (o.mode, o.gamma, o.alpha, o.beta, o.seed) == ("sigmoid", 4, -10.0, 10.0, 7)
    auto = decoder_from_args(parse("--target", str(TINY_EN_DIR), "--draft", "derived", "--draft-vocab", "0",
                                   "--no-cuda-graphs", "--no-weight-packing", "--default-allocator"))
    assert (auto.options.gamma, auto.options.gamma_policy) == (None, "cost")
    assert auto.runtime == RuntimeOptions(draft_vocab=None, cuda_graphs="off", packed_weights=False,
                                          keep_freed_memory=False)
    assert not auto.target_runtime.head.weight.is_mkldnn
    heuristic = decoder_from_args(parse("--target", str(TINY_EN_DIR), "--draft", "derived", "--gamma", "heuristic"))
    assert (heuristic.options.gamma, heuristic.options.gamma_policy) == (None, "heuristic")
    assert heuristic.runtime == RuntimeOptions()
    low = decoder_from_args(parse("--target", str(TINY_EN_DIR), "--draft", "none", "--encoder-matmul-dtype", "bfloat16"))
    assert low.runtime == RuntimeOptions(encoder_matmul_dtype="bfloat16")
    assert decoder.pair.draft is not None and decoder.pair.shared_encoder
    # no draft: speculative modes fall back to target-only decoding
    assert decoder_from_args(parse("--target", str(TINY_EN_DIR), "--draft", "none")).options.mode == "off"
    with pytest.raises(ModelLoadError, match="does not exist"):
        decoder_from_args(parse("--target", "/nonexistent/model"))
    with pytest.raises(ValueError, match="beta > alpha"):
        decoder_from_args(parse("--target", str(TINY_EN_DIR), "--mode", "sigmoid", "--alpha", "1", "--beta", "0"))


@pytest.mark.parametrize("entry", ["asr_app.cli.transcribe", "asr_app.cli.stream", "asr_app.eval.cli", "asr_app.ui"])
def test_every_entry_point_reports_a_missing_model_in_one_line(entry, capsys, tmp_path):
    import importlib
    import socket

    main = importlib.import_module(entry).main
    clip = tmp_path / "clip.wav"
    import numpy as np
    import soundfile as sf

    sf.write(clip, np.zeros(1600, dtype=np.float32), 16000)
    missing = ["--target", str(tmp_path / "no-such-model"), "--draft", "none", "--device", "cpu", "--threads", "1"]
    argv = {
        "asr_app.cli.transcribe": [str(clip), *missing],
        "asr_app.cli.stream": ["--simulate", str(clip), "--fast", *missing],
        "asr_app.eval.cli": ["--dataset", "folder", "--data-dir", str(tmp_path), "--modes", "off", *missing],
        "asr_app.ui": ["--port", "0", *missing],
    }[entry]
    if entry == "asr_app.eval.cli":
        (tmp_path / "clip.txt").write_text("nothing\n")
    if entry == "asr_app.ui":
        with socket.socket() as s:  # a free port, so the launcher gets as far as loading the models
            s.bind(("127.0.0.1", 0))
            argv[1] = str(s.getsockname()[1])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot load the models" in err and "no-such-model" in err and "Traceback" not in err
