"""Teachers for on-policy distillation: frozen models scored on the student's own rollouts.

A teacher is another checkpoint (the pipeline's RL model, the pre-RL base for RIDE) loaded frozen, or the
policy itself read under `torch.no_grad` with a privileged context (OPSD-style self-teachers). Either way
its tensors never carry gradient, and `assert_no_grad` checks that where they are produced and used.
A teacher reads completions with `models/logprobs.completion_forward`, the forward pass the policy uses
too, so a teacher read with a longer (privileged) prompt is aligned with the student token by token.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.errors import UserError, assert_no_grad
from posttrain.models.logprobs import CompletionOutputs, completion_forward


def freeze(model: PreTrainedModel) -> PreTrainedModel:
    """Eval mode, no parameter requires grad (the teacher never learns and never builds a graph)."""
    model.eval().requires_grad_(False)
    assert not any(p.requires_grad for p in model.parameters())
    return model


def load_teacher(path: str | Path, student_tokenizer: PreTrainedTokenizerBase, dtype: str, device: torch.device) -> PreTrainedModel:
    """A frozen teacher from a `from_pretrained` directory; it must share the student's vocabulary, because
    on-policy distillation scores the student's token ids under the teacher."""
    from posttrain.models.factory import load_pretrained

    model, tokenizer = load_pretrained(path, dtype)
    if tokenizer.get_vocab() != student_tokenizer.get_vocab():
        raise UserError(f"teacher at {path} has a different tokenizer than the student; on-policy distillation needs a shared vocabulary")
    return freeze(model.to(device))


@torch.no_grad()
def teacher_forward(
    model: PreTrainedModel, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, attention_mask: Tensor,
    temperature: float = 1.0, hidden: bool = False, full: bool = True,
) -> CompletionOutputs:
    """`completion_forward` as a teacher: no graph, and asserted so."""
    out = completion_forward(model, prompt_ids, prompt_mask, completion_ids, attention_mask, temperature, full=full, hidden=hidden)
    assert_no_grad(teacher_logp=out.logp, teacher_logprobs=out.logprobs, teacher_hidden=out.hidden)
    return out
