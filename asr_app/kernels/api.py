"""The one entry point of the verification step, and the draft's sampling distribution.

``verify`` checks its inputs (shapes, dtypes, devices, parameters: clear ``ValueError`` messages),
draws the step's random numbers from the caller's generator on the logits' device (or takes the ones
the caller drew, which a CUDA graph needs: see ``randomness``), and dispatches:
CPU (or any non-CUDA) tensors go to the PyTorch implementations, CUDA tensors to the Triton
kernels. Nothing inside copies to the host for the Triton modes; the caller does one copy.
"""

from __future__ import annotations

import math

import torch

from .baseline import verify_baseline
from .exact import verify_exact_torch, verify_exact_triton
from .greedy import verify_greedy_torch, verify_greedy_triton
from .sigmoid import verify_sigmoid_torch, verify_sigmoid_triton
from .triton_support import HAS_TRITON
from .types import VERIFY_MODES, VerifyMode, VerifyRandomness, VerifyResult, draw_randomness

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def verify(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    mode: VerifyMode = "exact",
    temperature: float = 1.0,
    alpha: float = -1e3,
    beta: float = 1e3,
    generator: torch.Generator | None = None,
    randomness: VerifyRandomness | None = None,
    check_values: bool = True,
) -> VerifyResult:
    """Verify ``g`` drafted tokens per row against the target's scores.

    target_logits [B, g+1, V] and draft_logits [B, g, V] are processed logits (after Whisper's
    logit rules; -inf allowed), fp16/bf16/fp32; draft_tokens int [B, g]; num_draft int [B] (row b
    uses its first num_draft[b] drafts). ``temperature == 0`` or mode "greedy" verifies greedily.
    ``randomness``: the step's uniforms [B, g+1], drawn by the caller (exact and sigmoid modes; a captured
    step cannot draw from a generator it does not own); None draws them from ``generator``. Mode baseline
    keeps transformers' own draws from ``generator``. ``check_values=False`` skips the checks that read
    tensor values (token ranges), which a step captured in a CUDA graph must not do; shapes, dtypes and
    devices are always checked. On CUDA those value checks never run (they would be a host sync).
    """
    _check_inputs(target_logits, draft_logits, draft_tokens, num_draft, mode, temperature, alpha, beta,
                  check_values)
    if generator is not None and generator.device.type != target_logits.device.type:
        raise ValueError(f"the generator is on {generator.device} but the logits are on {target_logits.device}; "
                         "create it with torch.Generator(device=logits.device)")
    use_triton = target_logits.is_cuda and HAS_TRITON
    if mode == "greedy" or temperature == 0:
        if use_triton:
            return verify_greedy_triton(target_logits, draft_tokens, num_draft)
        return verify_greedy_torch(target_logits, draft_tokens, num_draft)
    if mode == "baseline":
        return verify_baseline(target_logits, draft_logits, draft_tokens, num_draft, temperature, generator)
    gamma = target_logits.shape[1] - 1
    if randomness is None:
        randomness = draw_randomness(target_logits.shape[0], gamma, target_logits.device, generator)
    elif tuple(randomness.uniforms.shape) != (target_logits.shape[0], gamma + 1):
        raise ValueError(f"randomness.uniforms must be [B, g+1] = {(target_logits.shape[0], gamma + 1)}, "
                         f"got {tuple(randomness.uniforms.shape)}")
    if mode == "exact":
        impl = verify_exact_triton if use_triton else verify_exact_torch
        return impl(target_logits, draft_logits, draft_tokens, num_draft, randomness, temperature)
    impl = verify_sigmoid_triton if use_triton else verify_sigmoid_torch
    return impl(target_logits, draft_logits, draft_tokens, num_draft, randomness, temperature, alpha, beta)


def draft_probs_from_logits(
    logits: torch.Tensor,
    mode: VerifyMode = "exact",
    temperature: float = 1.0,
    alpha: float = -1e3,
    beta: float = 1e3,
) -> torch.Tensor:
    """float32 [..., V]: the distribution the draft samples from, i.e. the q that ``verify`` assumes.

    baseline/exact/sigmoid: softmax(z / T); greedy or T == 0: one-hot at the argmax (lowest id on
    ties). In sigmoid mode the draft still samples from its own softmax, as in Wagner et al. 2024,
    where the sigmoid replaces the softmax only inside the verification step: sampling the draft from
    the normalised sigmoid instead makes it near-uniform at the paper's alpha/beta = -/+1e3 (every
    token's weight is about 0.5), and the decoded text is noise. ``alpha``/``beta`` are accepted for a
    uniform signature and checked, but do not change q.
    """
    _check_mode_and_parameters(mode, temperature, alpha, beta)
    if logits.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"draft logits must be float16, bfloat16 or float32, got {logits.dtype}")
    if mode == "greedy" or temperature == 0:
        one_hot = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        return one_hot.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    z = logits.float() * (1.0 / temperature) if temperature != 1.0 else logits.float()
    return torch.softmax(z, dim=-1)


def _check_mode_and_parameters(mode: str, temperature: float, alpha: float, beta: float) -> None:
    if mode not in VERIFY_MODES:
        raise ValueError(f"unknown verification mode {mode!r}; expected one of {', '.join(VERIFY_MODES)}")
    if not (isinstance(temperature, int | float) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if mode == "sigmoid" and not (math.isfinite(alpha) and math.isfinite(beta) and beta > alpha):
        raise ValueError(f"sigmoid mode needs finite alpha < beta, got alpha={alpha!r}, beta={beta!r}")


def _check_inputs(target_logits, draft_logits, draft_tokens, num_draft, mode, temperature, alpha, beta,
                  check_values: bool = True) -> None:
    _check_mode_and_parameters(mode, temperature, alpha, beta)
    for name, t in (("target_logits", target_logits), ("draft_logits", draft_logits),
                    ("draft_tokens", draft_tokens), ("num_draft", num_draft)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if target_logits.dim() != 3:
        raise ValueError(f"target_logits must be [B, g+1, V], got shape {tuple(target_logits.shape)}")
    batch, rows, vocab = target_logits.shape
    gamma = rows - 1
    if batch < 1 or rows < 1 or vocab < 1:
        raise ValueError(f"target_logits must have B >= 1, g+1 >= 1 and V >= 1, got {tuple(target_logits.shape)}")
    if tuple(draft_logits.shape) != (batch, gamma, vocab):
        raise ValueError(f"draft_logits must be [B, g, V] = {(batch, gamma, vocab)} to match target_logits "
                         f"{tuple(target_logits.shape)}, got {tuple(draft_logits.shape)}")
    if tuple(draft_tokens.shape) != (batch, gamma):
        raise ValueError(f"draft_tokens must be [B, g] = {(batch, gamma)}, got {tuple(draft_tokens.shape)}")
    if tuple(num_draft.shape) != (batch,):
        raise ValueError(f"num_draft must be [B] = ({batch},), got {tuple(num_draft.shape)}")
    for name, t in (("target_logits", target_logits), ("draft_logits", draft_logits)):
        if t.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    for name, t in (("draft_tokens", draft_tokens), ("num_draft", num_draft)):
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
    devices = {t.device for t in (target_logits, draft_logits, draft_tokens, num_draft)}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(str(d) for d in devices)}")
    if check_values and not target_logits.is_cuda:
        # Value checks cost a host sync on a GPU, so they run only where there is no device to wait for.
        if num_draft.numel() and (int(num_draft.min()) < 0 or int(num_draft.max()) > gamma):
            raise ValueError(f"num_draft values must lie in [0, g={gamma}], got {num_draft.tolist()}")
        used = torch.arange(gamma)[None, :] < num_draft[:, None]
        bad = used & ((draft_tokens < 0) | (draft_tokens >= vocab))
        if bool(bad.any()):
            raise ValueError(f"draft_tokens used by num_draft must lie in [0, V={vocab}), "
                             f"got {draft_tokens[bad][:5].tolist()}")
