"""Build a tiny causal LM from a config, or load any causal LM through `from_pretrained`.

Nothing here downloads at run time in tests: tiny models are built from `ModelConfig` sizes and saved
with `save_pretrained`; real users give `model.path` (a local directory or hub id) and get the same
loading code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from posttrain.config import HUB_ID, LoraConfig, ModelConfig
from posttrain.errors import UserError
from posttrain.models.chat import PromptFormat, configure_prompts
from posttrain.models.precision import apply_precision
from posttrain.models.decoders import use_cuda_graphs, use_sampler_dtype

_ARCH = {"qwen2": Qwen2Config, "llama": LlamaConfig}


def select_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("pipeline.device is 'cuda' but no CUDA device is available")
    return torch.device(name)


def build_tiny(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """A freshly initialised Qwen2/Llama-shaped model sized by `cfg`, with the tokenizer's vocabulary."""
    config = _ARCH[cfg.arch](
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=cfg.max_positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        dtype=cfg.dtype,
    )
    return AutoModelForCausalLM.from_config(config, dtype=getattr(torch, cfg.dtype))


_PLAIN_PIPELINES = {"TokenizersBackend", "PreTrainedTokenizerFast"}  # tokenizers saved as a bare `tokenizers` pipeline
# the files transformers builds a tokenizer from (fast pipeline, sentencepiece, BPE / WordPiece vocabularies)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
# what a damaged saved directory raises: unreadable files (transformers' own error for a bad config.json is an
# OSError), JSON cut short, and a .safetensors file truncated or emptied (its header no longer parses)
UNREADABLE = (OSError, json.JSONDecodeError, SafetensorError)


# the errors that do not say which file is damaged: where to look, and how to tell a damaged file
_PARSERS = {
    SafetensorError: ("*.safetensors", lambda file: safe_open(file, "pt")),
    json.JSONDecodeError: ("*.json", lambda file: json.loads(file.read_text())),
}


def _damaged_file(path: str | Path, error: Exception) -> str | None:
    """The first file under `path` of the kind that raised `error` that does not parse, or None."""
    kind = next((k for k in _PARSERS if isinstance(error, k)), None)
    if kind is None:
        return None
    pattern, parse = _PARSERS[kind]
    for file in sorted(Path(path).rglob(pattern)):
        try:
            parse(file)
        except kind:
            return str(file)
    return None


@contextmanager
def readable(path: str | Path, what: str) -> Iterator[None]:
    """Loading `what` from a saved directory: a damaged or incomplete one is one `UserError` line naming it (and
    the damaged file, when the error does not), not the loader's traceback. Only the error types a damaged
    file raises are caught; anything else is a bug and keeps its traceback."""
    try:
        yield
    except UNREADABLE as e:
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        damaged = _damaged_file(path, e)
        detail = f"{damaged} is truncated or damaged ({reason})" if damaged else reason
        raise UserError(f"cannot load {what} from {path}: {detail}") from None


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved at `path` (or a hub id), exactly as it was saved.

    A bare `tokenizers` pipeline (our character and word tokenizers) is reloaded as such: transformers 5's
    AutoTokenizer would pick the class of the model type in config.json instead (Qwen2Tokenizer for our tiny
    Qwen2 models), which rebuilds its own pre-tokenizer over the saved vocabulary and silently drops spaces.
    A local directory without any tokenizer file is refused up front (transformers would fail with a page
    about converting slow tokenizers)."""
    local = Path(path)
    if local.is_dir() and not any((local / name).is_file() for name in TOKENIZER_FILES):
        raise UserError(f"no tokenizer in {path}: tokenizer.json is missing (a model directory holds its tokenizer)")
    with readable(path, "the tokenizer"):
        saved = local / "tokenizer_config.json"
        if saved.is_file() and json.loads(saved.read_text()).get("tokenizer_class") in _PLAIN_PIPELINES:
            return PreTrainedTokenizerFast.from_pretrained(path)
        return AutoTokenizer.from_pretrained(path)


def load_pretrained(path: str | Path, dtype: str = "float32") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a local directory or a hub id."""
    local = Path(path)
    if not local.exists() and not HUB_ID.fullmatch(str(path)):
        raise UserError(f"model path not found: {path}")
    if local.exists() and not (local / "config.json").is_file():
        raise UserError(f"not a model directory (no config.json): {path}")
    tokenizer = load_tokenizer(path)
    with readable(path, "model"):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def maybe_lora(model: PreTrainedModel, cfg: LoraConfig) -> PreTrainedModel:
    """Wrap `model` with LoRA adapters when `cfg.r > 0`; otherwise return it unchanged."""
    if cfg.r == 0:
        return model
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_cfg = PeftLoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules), task_type="CAUSAL_LM"
    )
    return get_peft_model(model, peft_cfg)


def prepare_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: ModelConfig, device: torch.device, *, train: bool = True
) -> PreTrainedModel:
    """What `model.*` says about a loaded (or freshly built) model, in one place: the prompt format on the
    tokenizer (models/chat.py), the device, LoRA adapters and activation checkpointing when it trains, and
    autocast (models/precision.py). Returns the model to use (LoRA-wrapped when `model.lora.r > 0`)."""
    configure_prompts(tokenizer, PromptFormat(cfg.chat_template, cfg.system_prompt, cfg.max_prompt_tokens))
    model = model.to(device)
    if train:
        model = maybe_lora(model, cfg.lora)
    apply_precision(model, cfg.autocast, cfg.gradient_checkpointing and train, device)
    use_cuda_graphs(model, cfg.cuda_graphs)
    if cfg.sampler_dtype == "float16" and device.type != "cuda":
        raise UserError(f"model.sampler_dtype float16 needs a CUDA device (this run uses {device.type}); use bfloat16")
    use_sampler_dtype(model, cfg.sampler_dtype)
    return model


def save_pretrained(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out: Path) -> None:
    """Save a plain `from_pretrained`-loadable model: LoRA adapters are merged first. An FSDP-sharded model is
    gathered whole first (a collective: every rank calls this; each rank writes where it was told)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        seen: set[int] = set()
        for name, param in model.named_parameters(remove_duplicate=False):  # tied weights: saved once, as unsharded
            if id(param) in seen:
                state.pop(name, None)
            seen.add(id(param))
        model.save_pretrained(out, state_dict=state)
        tokenizer.save_pretrained(out)
        return
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
