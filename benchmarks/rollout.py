"""Rollout speed on any device (a GPU benchmark): our `sample()` against `model.generate` with its KV cache.

    python benchmarks/rollout.py --json rollout.json --device cuda \\
        --set model.hidden_size=896 --set model.intermediate_size=4864 --set model.layers=24 ...

Same model (random init from `params.yaml`'s `model` section plus overrides; EOS is disabled on both sides,
so every row produces exactly `rl.max_new_tokens` tokens and trained weights would not change the work),
same prompts, group size and temperature; repeats alternate between the two, medians are reported.
Writes `{"ours_rollout_tok_s", "hf_rollout_tok_s", "rollout_ratio", ...}`. Target: rollout_ratio >= 1.5.
`benchmarks/grpo_step.py` measures the same on the CPU next to a full GRPO step against TRL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from grpo_step import ROLLOUT_TARGET, build, quiet, run_rollouts  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args(argv)
    quiet()
    import torch
    import transformers

    from posttrain import resolve

    cfg = resolve.load(args.params, args.overrides)
    started = time.perf_counter()
    _, train, tokenizer, model = build(cfg, sft_steps=0)
    result = run_rollouts(cfg, train, tokenizer, model, args.repeats, device=args.device, warmup=args.warmup)
    rl = cfg.rl
    result.update({
        "rollout_target_met": result["rollout_ratio"] >= ROLLOUT_TARGET,
        "settings": {
            "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "threads": torch.get_num_threads(),
            "prompts": rl.prompts_per_step, "group_size": rl.group_size, "max_new_tokens": rl.max_new_tokens,
            "temperature": rl.temperature, "model": cfg.model.model_dump(mode="json"),
            "parameters": sum(p.numel() for p in model.parameters()), "repeats": args.repeats,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        },
        "wall_s": time.perf_counter() - started,
    })
    s = result["settings"]
    print(f"rollout on {s['device']}: {s['prompts']} prompts x G={s['group_size']} x {s['max_new_tokens']} tokens, "
          f"{s['parameters']:,} params ({cfg.model.dtype}), medians of {args.repeats}")
    print(f"{'':16}{'posttrain':>14}{'generate':>14}{'ratio':>9}  target")
    print(f"{'tokens/s':16}{result['ours_rollout_tok_s']:>14,.0f}{result['hf_rollout_tok_s']:>14,.0f}{result['rollout_ratio']:>9.3f}"
          f"  >= {ROLLOUT_TARGET}  {'met' if result['rollout_target_met'] else 'MISSED'}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
