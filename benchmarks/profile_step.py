"""Where one GRPO step of ours spends its time, at a `grpo_step.py` shape (default `small`).

    python benchmarks/profile_step.py --json outputs/bench/profile_small.json [--shape small] [--threads 2] [--steps 3]

Two passes over `OnlineRL.step` (the body of the training loop) after one warm-up step:
* cProfile over `--steps` steps: cumulative seconds of the step's parts (rollout = prefill + decode forwards +
  sampling + decoding/rewards; the log-prob recompute with grad; backward; optimizer step), and the Python
  overhead = self time of Python-level functions (everything that is not a builtin / C call). cProfile slows
  Python-heavy code, so the overhead share is an upper bound.
* torch.profiler over one step: the top operators by self CPU time (matmuls vs the rest).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_step  # noqa: E402  (the benchmark's shapes, build and loop)

# (file suffix, function) -> part of the step; seconds are cumulative (callees included)
PARTS = {
    "step": ("online_rl.py", "step"),
    "rollout": ("online_rl.py", "rollout"),
    "sample": ("decode.py", "sample"),
    "prefill": ("decoders.py", "prefill"),
    "decode_forward": ("decoders.py", "step"),
    "decode_completions": ("sampling.py", "decode_completions"),
    "rewards": ("", "reward_matrix"),
    "logprob_recompute": ("online_rl.py", "policy_forward"),
    "backward": ("_tensor.py", "backward"),
    "optimizer": ("", "optimizer_step"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--shape", choices=sorted(grpo_step.SHAPES), default="small")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (cProfile)")
    parser.add_argument("--top", type=int, default=15, help="operators listed from torch.profiler")
    return parser.parse_args(argv)


def cumulative(stats: pstats.Stats) -> dict[str, float]:
    out = {}
    for name, (suffix, func) in PARTS.items():
        rows = [v for (file, _, fn), v in stats.stats.items() if fn == func and file.endswith(suffix) and file != "~"]
        if name == "step":  # OnlineRL.step, not the decoder's step
            rows = [v for (file, _, fn), v in stats.stats.items() if fn == func and file.endswith("online_rl.py")]
        out[name] = sum(v[3] for v in rows)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    grpo_step.quiet()
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(args.threads)
    bench = grpo_step.parse_args(["--json", str(args.json), "--params", args.params, "--shape", args.shape,
                                  *[x for o in args.overrides for x in ("--set", o)], "--steps", str(args.steps + 2)])
    cfg = grpo_step.load_config(bench)
    task, train, tokenizer, model = grpo_step.build(cfg, bench.sft_steps, eos=bench.eos, vocab=bench.vocab)
    loop = grpo_step.OurLoop(cfg, task, train, tokenizer, model)
    load_start = grpo_step.load_average()
    loop.step()  # warm-up

    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for _ in range(args.steps):
        loop.step()
    profiler.disable()
    wall = (time.perf_counter() - start) / args.steps
    stats = pstats.Stats(profiler)
    parts = {k: v / args.steps for k, v in cumulative(stats).items()}
    python_self = sum(v[2] for (file, _, _), v in stats.stats.items() if file != "~") / args.steps
    step = parts["step"]
    breakdown = {
        "prefill": parts["prefill"],
        "decode_forward": parts["decode_forward"],
        "sampling (log_softmax, draw, bookkeeping)": parts["sample"] - parts["prefill"] - parts["decode_forward"],
        "decode_text_and_rewards": parts["rollout"] - parts["sample"],
        "logprob_recompute_forward": parts["logprob_recompute"],
        "backward": parts["backward"],
        "optimizer": parts["optimizer"],
    }
    breakdown["other"] = step - sum(breakdown.values())

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loop.step()
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total_self = sum(e.self_cpu_time_total for e in ops)
    top = [{"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "share": e.self_cpu_time_total / total_self, "calls": e.count}
           for e in ops[: args.top]]

    result = {
        "shape": args.shape, "threads": args.threads, "steps": args.steps, "step_s_unprofiled_estimate": None,
        "step_s_under_cprofile": wall, "step_s_cumulative": step,
        "breakdown_s": breakdown, "breakdown_share": {k: v / step for k, v in breakdown.items()},
        "python_self_s": python_self, "python_self_share": python_self / step,
        "torch_profiler_top_ops": top, "torch_profiler_total_self_s": total_self / 1e6,
        "parameters": sum(p.numel() for p in model.parameters()),
        "load_average": {"start": load_start, "end": grpo_step.load_average()},
    }
    start = time.perf_counter()
    loop.step()
    result["step_s_unprofiled_estimate"] = time.perf_counter() - start  # one plain step, for scale
    print(f"shape {args.shape}, {args.threads} thread(s), step {step:.3f}s under cProfile "
          f"(plain step {result['step_s_unprofiled_estimate']:.3f}s), load average {load_start}")
    for name, seconds in breakdown.items():
        print(f"  {name:44}{seconds:>8.3f}s {seconds / step:>7.1%}")
    print(f"  {'python self time (all parts)':44}{python_self:>8.3f}s {python_self / step:>7.1%}")
    print("top operators (torch.profiler, self CPU):")
    for row in top:
        print(f"  {row['op']:44}{row['self_s']:>8.3f}s {row['share']:>7.1%}  x{row['calls']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
