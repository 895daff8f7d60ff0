"""Teachers for on-policy distillation: frozen models scored on the student's own rollouts.

A teacher is another checkpoint (the pipeline's RL model, the pre-RL base for RIDE) loaded frozen, or the
policy itself read under `torch.no_grad` with a privileged context (OPSD-style self-teachers). Either way
its tensors never carry gradient, and `assert_no_grad` checks that where they are used.

`completion_forward` is the one forward pass both sides share: for each completion token y_t it returns the
temperature-scaled log-distribution that predicted it ([B, T, V]) and, if asked, the hidden states of every
layer at those predicting positions ([L, B, T, d]), so a teacher read with a longer (privileged) prompt is
aligned with the student token by token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.errors import UserError
from posttrain.models.decoders import positions_from_mask


@dataclass(frozen=True)
class CompletionOutputs:
    logprobs: Tensor  # [B, T, V] log pi(. | context, y_<t), temperature-scaled
    hidden: Tensor | None  # [L, B, T, d] the output of each decoder layer at the position that predicts y_t

    def sampled(self, completion_ids: Tensor) -> Tensor:
        """[B, T] log-prob of the tokens actually in the completion."""
        return self.logprobs.gather(-1, completion_ids[..., None]).squeeze(-1)


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


def assert_no_grad(**tensors: Tensor) -> None:
    for name, tensor in tensors.items():
        if tensor is not None and tensor.requires_grad:
            raise AssertionError(f"{name} must not carry gradient (teacher, base and reference tensors are constants)")


def completion_forward(
    model: PreTrainedModel, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor,
    temperature: float = 1.0, hidden: bool = False,
) -> CompletionOutputs:
    """One forward pass over left-padded `prompt + completion` (with gradient if the caller has it on)."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    width = completion_ids.shape[1]
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask), output_hidden_states=hidden, logits_to_keep=width + 1
    )
    logprobs = torch.log_softmax(out.logits[:, :-1].float() / temperature, dim=-1)
    states = None
    if hidden:
        start = prompt_ids.shape[1] - 1  # the position whose output predicts the first completion token
        states = torch.stack([h[:, start : start + width] for h in out.hidden_states[1:]])
    return CompletionOutputs(logprobs, states)


@torch.no_grad()
def teacher_forward(
    model: PreTrainedModel, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor,
    temperature: float = 1.0, hidden: bool = False,
) -> CompletionOutputs:
    """`completion_forward` as a teacher: no graph, and asserted so."""
    out = completion_forward(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature, hidden)
    assert_no_grad(teacher_logprobs=out.logprobs, teacher_hidden=out.hidden)
    return out
