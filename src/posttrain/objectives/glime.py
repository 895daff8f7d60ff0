"""GLIME's gradient constraint (spec §15, derived from the 2026 abstract): an A-GEM projection (Chaudhry et al.
2019, "Efficient Lifelong Learning with A-GEM", arXiv 1812.00420, eq. 11) that keeps a new edit's update from
raising the loss of replayed earlier edits to first order:

    if <g, g_ref> < 0:   g <- g - (<g, g_ref> / ||g_ref||^2) g_ref       (otherwise g is unchanged)

g is the gradient of the current edits' loss (L_edit + lambda_p L_pref, the DPO term over the model's own
generations), g_ref the gradient on edits replayed from the memory buffer; both flattened over the edited
parameters. Invariants: after projection <g, g_ref> >= 0; an empty replay buffer (g_ref None) leaves g as is.
Only this constraint is implemented; the editing loop and its synthetic fact stream are not built yet.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def project_gradient(g: Tensor, g_ref: Tensor | None) -> Tensor:
    """g with its component against g_ref removed when the two conflict (flat tensors)."""
    if g_ref is None:
        return g
    dot = torch.dot(g, g_ref)
    norm = torch.dot(g_ref, g_ref)
    if dot >= 0 or norm == 0:
        return g
    return g - (dot / norm) * g_ref


def project_parameter_grads(params: Sequence[torch.nn.Parameter], ref_grads: Sequence[Tensor] | None) -> bool:
    """Apply `project_gradient` to the .grad of `params` in place, with `ref_grads` (one per parameter) as g_ref;
    returns True when the gradients conflicted and were projected."""
    if ref_grads is None:
        return False
    flat = torch.cat([p.grad.flatten() for p in params])
    ref = torch.cat([r.flatten() for r in ref_grads])
    projected = project_gradient(flat, ref)
    if projected is flat:
        return False
    offset = 0
    for p in params:
        p.grad.copy_(projected[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return True
