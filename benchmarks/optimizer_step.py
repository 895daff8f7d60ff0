"""The optimiser step at the 135M shape: AdamW as posttrain builds it (trainers/common.py: the fused kernel) against
torch's default (foreach), on the same tensors in the same run, printed as a ratio (lower is faster).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/optimizer_step.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from posttrain.trainers.common import optimizer_and_schedule

SHAPES = [(49152, 576)] + [(576, 576)] * 30 * 2 + [(192, 576)] * 30 * 2 + [(1536, 576)] * 30 * 3  # SmolLM2-135M's matrices


def seconds_per_step(optimizer: torch.optim.Optimizer, repeats: int) -> float:
    optimizer.step()  # the state is allocated on the first step
    start = time.perf_counter()
    for _ in range(repeats):
        optimizer.step()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in SHAPES]
    for t in params:
        t.grad = torch.randn_like(t)
    ours, _ = optimizer_and_schedule(params, 1e-5, 0.0, 0, 10)
    default = torch.optim.AdamW(params, lr=1e-5)
    result = {"parameters": sum(t.numel() for t in params), "threads": torch.get_num_threads(), "fused": bool(ours.defaults.get("fused")),
              "ours_s": seconds_per_step(ours, args.repeats), "torch_default_s": seconds_per_step(default, args.repeats)}
    result["ratio"] = result["ours_s"] / result["torch_default_s"]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
