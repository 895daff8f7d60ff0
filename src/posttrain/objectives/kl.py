"""The k3 estimator of KL(pi_theta || pi_ref) per sampled token (Schulman 2020, "Approximating KL
divergence"; the GRPO penalty of DeepSeekMath, arXiv 2402.03300, eq. 4):

    d = logp_ref - logp_theta,   KL3 = exp(d) - d - 1   (>= 0, and 0 with zero gradient at equality)
"""

from __future__ import annotations

import torch
from torch import Tensor


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    assert not ref_logp.requires_grad, "reference log-probs must not carry gradient"
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0
