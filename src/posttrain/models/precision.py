"""Mixed precision and activation checkpointing of a loaded model: `model.autocast` and
`model.gradient_checkpointing`, switched on once where a stage prepares its model (`factory.prepare_model`).

Autocast is attached to the model, not to the loops: a forward pre-hook enters `torch.autocast` and a forward
hook (run even when the forward raises) leaves it, on the model and on its direct children (a reward model's
scorer runs `model.base_model` and `model.score` itself), so every forward of every loop runs under it. The two
paths that call the model's submodules directly (the sampler's decoder and the shared-prompt training forward,
models/decoders.py) enter `autocast(model)` themselves. Weights stay in `model.dtype` (float32 by default):
autocast runs matmuls in bf16 / fp16 and keeps reductions in float32. fp16 needs CUDA (and has no loss scaling
here: a step whose gradients overflow is skipped by the training loop's guard); bf16 runs on CPU and GPU.

Checkpointing uses transformers' `activation_checkpointing_enable` (non-reentrant, so LoRA adapters need no
input-gradient hook); the shared-prompt forward, which bypasses the decoder layers, is then not used for
training (models/logprobs.py), so the memory saving holds in RL too.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from transformers import PreTrainedModel

from posttrain.errors import UserError
from posttrain.models.decoders import unwrap

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_SPEC, _STACK = "posttrain_autocast", "posttrain_autocast_stack"  # model attributes: (device type, dtype); open contexts


def _enter(module: torch.nn.Module, args) -> None:
    context = torch.autocast(*getattr(module, _SPEC))
    context.__enter__()
    getattr(module, _STACK).append(context)


def _leave(module: torch.nn.Module, args, output) -> None:
    getattr(module, _STACK).pop().__exit__(None, None, None)


def apply_precision(model: PreTrainedModel, autocast_mode: str, gradient_checkpointing: bool, device: torch.device) -> None:
    """Switch on autocast (`none`, `bf16`, `fp16`) and activation checkpointing for `model` (LoRA-wrapped or not:
    both go on the transformers model inside, which a LoRA wrapper calls)."""
    if autocast_mode == "fp16" and device.type != "cuda":
        raise UserError(f"model.autocast fp16 needs a CUDA device (this run uses {device.type}); use bf16 or none")
    inner = unwrap(model)
    if gradient_checkpointing:
        inner.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    if autocast_mode != "none" and getattr(inner, _SPEC, None) is None:
        for module in (inner, *inner.children()):  # callers that run the backbone or the head on their own, too
            setattr(module, _SPEC, (device.type, AUTOCAST_DTYPES[autocast_mode]))
            setattr(module, _STACK, [])
            module.register_forward_pre_hook(_enter)
            module.register_forward_hook(_leave, always_call=True)


def autocast(model: PreTrainedModel) -> AbstractContextManager:
    """The model's autocast context (a no-op without one), for code that calls its submodules directly."""
    spec = getattr(unwrap(model), _SPEC, None)
    return torch.autocast(*spec) if spec else nullcontext()


def checkpointing(model: PreTrainedModel) -> bool:
    """True while `model` trains with activation checkpointing on."""
    return model.training and bool(getattr(unwrap(model), "is_activation_checkpointing", False))
