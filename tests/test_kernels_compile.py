"""Every Triton kernel compiles for a real GPU (sm_90, Hopper) down to PTX and a cubin.

The interpreter (used by the identity tests) executes kernels with NumPy and accepts some
programs the compiler rejects (type mismatches of loop-carried values, unsupported ops), so this
checks the other half: Triton's own compiler, which needs no GPU to produce PTX. It runs in a
child process because conftest sets TRITON_INTERPRET=1 for this one, and under the interpreter
``triton.jit`` gives functions the compiler cannot take.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from asr_app.kernels import exact, greedy, sampling, sigmoid  # noqa: E402
from asr_app.runtime import fused  # noqa: E402

STRIDES = {"t_stride_b": "i32", "t_stride_c": "i32", "d_stride_b": "i32", "d_stride_c": "i32"}
SIZES = {"vocab": "i32", "gamma": "i32", "num_splits": "i32"}
LOGITS = {"target_ptr": "*fp16", "draft_ptr": "*fp16"}

KERNELS = {
    "exact-row-partials": (exact._row_partials_kernel, {
        **LOGITS, "num_draft_ptr": "*i64", "partials_ptr": "*fp32", **STRIDES, **SIZES,
        "inv_temperature": "fp32"}, {"BLOCK_V": 1024, "TILES": 4}),
    "exact-accept": (exact._accept_kernel, {
        **LOGITS, "draft_tokens_ptr": "*i64", "num_draft_ptr": "*i64", "uniforms_ptr": "*fp64",
        "partials_ptr": "*fp32", "masses_ptr": "*fp64", "row_n_ptr": "*i32", "row_lse_ptr": "*fp32",
        **STRIDES, "tok_stride_b": "i32", **SIZES, "inv_temperature": "fp32"},
        {"BLOCK_V": 1024, "TILES": 4, "ROWS_BLOCK": 8, "SPLITS_BLOCK": 16}),
    "sigmoid-accept": (sigmoid._accept_kernel, {
        **LOGITS, "draft_tokens_ptr": "*i64", "num_draft_ptr": "*i64", "uniforms_ptr": "*fp64",
        "masses_ptr": "*fp64", "split_max_ptr": "*fp32", "row_n_ptr": "*i32", "row_lse_ptr": "*fp32", **STRIDES,
        "tok_stride_b": "i32", **SIZES, "inv_temperature": "fp32", "alpha": "fp32", "inv_width": "fp32"},
        {"BLOCK_V": 1024, "TILES": 4, "ROWS_BLOCK": 8}),
    "greedy-argmax-partials": (greedy._argmax_partials_kernel, {
        "target_ptr": "*bf16", "num_draft_ptr": "*i64", "best_val_ptr": "*fp32", "best_idx_ptr": "*i32",
        "t_stride_b": "i32", "t_stride_c": "i32", **SIZES}, {"BLOCK_V": 1024, "TILES": 4}),
    "greedy-finalize": (greedy._greedy_finalize_kernel, {
        "draft_tokens_ptr": "*i64", "num_draft_ptr": "*i64", "best_val_ptr": "*fp32", "best_idx_ptr": "*i32",
        "out_tokens_ptr": "*i64", "out_accepted_ptr": "*i64", "tok_stride_b": "i32", **SIZES},
        {"ROWS_BLOCK": 8, "SPLITS_BLOCK": 16}),
}
for flag in (False, True):
    KERNELS[f"finalize-sample-sigmoid={flag}"] = (sampling.finalize_sample_kernel, {
        "target_ptr": "*fp32", "draft_ptr": "*fp32", "draft_tokens_ptr": "*i64", "uniforms_ptr": "*fp64",
        "masses_ptr": "*fp64", "split_max_ptr": "*fp32", "row_n_ptr": "*i32", "row_lse_ptr": "*fp32",
        "num_draft_ptr": "*i64",
        "out_tokens_ptr": "*i64", "out_accepted_ptr": "*i64", **STRIDES, "tok_stride_b": "i32", **SIZES,
        "inv_temperature": "fp32", "alpha": "fp32", "inv_width": "fp32"},
        {"BLOCK_V": 1024, "TILES": 4, "SPLITS_BLOCK": 16, "OUT_BLOCK": 8, "SIGMOID": flag})

# The fused decoder-layer kernels, in the shapes a decoding step launches them: one row (a token), a block of
# rows (a speculative step's tokens x batch), with the norm prologue, GELU and residual epilogues.
LINEAR = {"x_ptr": "*fp16", "w_ptr": "*fp16", "bias_ptr": "*fp16", "norm_w_ptr": "*fp16", "norm_b_ptr": "*fp16",
          "out_ptr": "*fp16", "n_rows": "i32", "n_out": "i32", "k_in": "i32", "x_stride": "i32",
          "out_stride": "i32", "eps": "fp32"}
QKV = {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "norm_w_ptr": "*bf16", "norm_b_ptr": "*bf16",
       "positions_ptr": "*i64", "q_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "n_rows": "i32",
       "tokens": "i32", "width": "i32", "head_dim": "i32", "x_stride": "i32", "cache_stride_b": "i32",
       "cache_stride_h": "i32", "cache_stride_p": "i32", "eps": "fp32", "q_scale": "fp32"}
# Element-wise tiles (one row, 8 rows) and tensor-core tiles (16 rows; `tl.dot`).
for rows, (block_n, block_k), dot in ((1, (16, 512), False), (8, (8, 64), False), (16, (32, 128), True)):
    for norm, gelu, residual in ((True, True, False), (False, False, True)):
        KERNELS[f"fused-linear-rows={rows}-dot={dot}-norm={norm}-gelu={gelu}-residual={residual}"] = (
            fused._linear_kernel, LINEAR, {"NORM": norm, "GELU": gelu, "RESIDUAL": residual, "DOT": dot,
                                           "BLOCK_M": rows, "BLOCK_N": block_n, "BLOCK_K": block_k})
    KERNELS[f"fused-qkv-rows={rows}-dot={dot}"] = (fused._qkv_kernel, QKV, {
        "DOT": dot, "BLOCK_M": rows, "BLOCK_N": block_n, "BLOCK_K": block_k})
# fp32 models take the tensor-core tile's full-precision ("ieee") product
KERNELS["fused-linear-fp32-dot"] = (fused._linear_kernel, {**LINEAR, **{name: "*fp32" for name in LINEAR if name.endswith("_ptr")}}, {
    "NORM": True, "GELU": False, "RESIDUAL": True, "DOT": True, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128})


def compile_all() -> None:
    """Child process: compile each kernel, print one line per kernel, exit 1 if any failed."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    failed = 0
    for name, (kernel, signature, constexprs) in KERNELS.items():
        try:
            assert set(signature) | set(constexprs) == set(kernel.arg_names), "signature must name every argument"
            full_signature = {**signature, **{k: "constexpr" for k in constexprs}}
            compiled = triton.compile(ASTSource(kernel, full_signature, constexprs=constexprs),
                                      target=GPUTarget("cuda", 90, 32))
            assert ".entry" in compiled.asm["ptx"] and len(compiled.asm["cubin"]) > 0
            print(f"ok {name}")
        except Exception as error:  # report every kernel, not just the first failure
            failed += 1
            print(f"FAILED {name}: {type(error).__name__}: {error}")
    sys.exit(1 if failed else 0)


def test_every_kernel_compiles_for_sm90():
    pytest.importorskip("triton", reason="Triton is a Linux-only dependency")
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    repo = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])
    child = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    report = child.stdout + child.stderr[-3000:]
    assert child.returncode == 0, report
    assert report.count("ok ") == len(KERNELS), report


if __name__ == "__main__":
    compile_all()
