"""The verification step of speculative decoding: one API, PyTorch references, Triton kernels.

``verify`` (see ``api.py``) for every mode; ``draft_probs_from_logits`` for the draft's sampling
distribution. Each mode's module holds its PyTorch reference next to its Triton kernels.
"""

from .api import draft_probs_from_logits, verify
from .types import VERIFY_MODES, VerifyMode, VerifyRandomness, VerifyResult, draw_randomness

__all__ = [
    "VERIFY_MODES",
    "VerifyMode",
    "VerifyRandomness",
    "VerifyResult",
    "draft_probs_from_logits",
    "draw_randomness",
    "verify",
]
