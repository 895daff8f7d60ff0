"""Trained tokens per second, synchronous against asynchronous RL (`rl.mode: async`), in one run.

    python benchmarks/async_throughput.py --json async.json [--steps 12] [--workers 2] [--threads 1] [--set rl.max_new_tokens=16 ...]

Both sides train the same randomly initialised policy (params.yaml's `model` section, the character tokenizer, the
arithmetic prompts) from separate copies of the same weights, for `--steps` updates of the same `rl` settings,
through `train_online_rl` (the stage's loop, no checkpoints). Sync samples and trains in turn in one process with
`--threads` torch threads; async runs `--workers` free-running worker processes (one thread each, `rl.pool_policy:
none`, `rl.correction: none`) next to the trainer with `--threads`. Trained tokens are the completion tokens of
every trained batch (`completion_length` x rows); the time is the loop's wall clock, worker start included. The two
sides alternate `--repeats` times and the medians count. Prints and writes `{"sync_tokens_per_s",
"async_tokens_per_s", "throughput_ratio", ...}` with the load average at the start and the end: the machine is shared,
so the ratio of one run is what counts. async only pays off when there are cores for the workers beside the trainer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHAPE = ["rl.prompts_per_step=8", "rl.group_size=4", "rl.max_new_tokens=16", "rl.warmup_steps=0", "rl.checkpoint_every=0",
         "rl.log_every=1000", "rl.rewards=[{name: correctness}, {name: overlong}]", "rl.overlong_buffer=8", "rl.workers.queued_groups=16"]


def one_side(mode: str, args, start_state, parts) -> dict[str, float]:
    import torch

    from posttrain import resolve
    from posttrain.trainers.online_rl import RLRun
    from posttrain.trainers.rl import train_online_rl

    cfg, task, examples, tokenizer, model = parts
    model.load_state_dict(start_state)
    rl = resolve.updated(cfg.rl, "rl", mode=mode, steps=args.steps, workers=cfg.rl.workers.model_copy(update={"count": args.workers}))
    with tempfile.TemporaryDirectory() as tmp:
        run = RLRun(model, tokenizer, task, examples, rl, seed=0, checkpoint_dir=Path(tmp) / "ck", config_hash="bench")
        start = time.perf_counter()
        history, _ = train_online_rl(run, False, on_log=lambda step, m: None)
        seconds = time.perf_counter() - start
    rows = rl.prompts_per_step * rl.group_size
    tokens = sum(h["completion_length"] * rows for h in history)
    torch.manual_seed(0)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()

    import torch

    from posttrain import resolve
    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.tasks import build_task

    torch.set_num_threads(args.threads)
    cfg = resolve.load(args.params, [*SHAPE, "pipeline.device=cpu", "tracking.enabled=false", *args.overrides])
    task = build_task(cfg.task)
    tokenizer = train_char_tokenizer([task.alphabet()])
    torch.manual_seed(0)
    model = build_tiny(cfg.model, tokenizer)
    start_state = {k: v.clone() for k, v in model.state_dict().items()}
    parts = (cfg, task, task.splits(0)["train"], tokenizer, model)
    load_start = os.getloadavg()[0]
    runs = {"sync": [], "async": []}
    for _ in range(args.repeats):
        for mode in ("sync", "async"):
            runs[mode].append(one_side(mode, args, start_state, parts))
    sync = statistics.median(r["tokens_per_s"] for r in runs["sync"])
    asyn = statistics.median(r["tokens_per_s"] for r in runs["async"])
    out = {"sync_tokens_per_s": sync, "async_tokens_per_s": asyn, "throughput_ratio": asyn / sync, "runs": runs,
           "steps": args.steps, "workers": args.workers, "threads": args.threads, "cpus": os.cpu_count(),
           "load_start": load_start, "load_end": os.getloadavg()[0]}
    args.json.write_text(json.dumps(out, indent=2))
    print(f"sync {sync:.0f} tok/s | async ({args.workers} workers) {asyn:.0f} tok/s | ratio {asyn / sync:.2f} "
          f"(load {load_start:.1f} -> {out['load_end']:.1f}, {os.cpu_count()} cpus)")


if __name__ == "__main__":
    sys.exit(main())
