"""Asynchronous RL at scale, simulated: the pool policies of rollout/pool.py (none, max_staleness, pace) run over
simulated time, with generation and training times taken from a cost model instead of measured.

Cost model (per trainer): `--workers` rollout workers each generate one group of `--group-size` completions at a
time, decoded as one batch, one token per `--decode-step` seconds; completion lengths are log-normal (median
`--median-tokens`, log-sd `--length-sigma`, capped at `--max-tokens`), so a group takes its longest completion's
time. A worker picks up a new policy version `--sync` seconds after the trainer publishes it, between decode steps,
and tags every token with the version it decoded under. A completed group enters the pool; the trainer, when free,
draws `--batch-groups` groups (after the policy's rejections), spends `--update` seconds on the update and publishes
the next version. Workers start staggered over one median group time. Each run lasts `--updates` trainer updates.

Arm `sync` is synchronous RL on the same cluster: the trainer hands its batch to the workers, waits for the last
group, trains; no token is stale, and no more than `--batch-groups` workers have work (`simulate_sync`).

Reported per (workers, arm), over seeds 0..n-1 (mean and 95% t interval): effective staleness of the trained
groups (mean, p95), its parts W, Gp and the naive span Gn, the share of pooled groups rejected, the mean occupancy
at a draw, the trainer's idle share (its time blocked on generation), trained groups per simulated second (the
wall clock to a number of updates) and the length bias (mean tokens per trained group over mean tokens per pooled
group: below 1, long rollouts are rejected more often). Verdicts (paired by seed): PACE trains on less stale groups
than unfiltered async, it keeps more of the long rollouts than the hard cap (its length bias nearer 1), it trains
more groups per second than sync and its trainer idles less, and prefix-aware Gp is below the naive Gn. Accuracy
is not modelled: the simulator says what each arm trains on and how fast, not what it learns.

    .venv/bin/python experiments/async_simulator.py [--workers 8 64] [--seeds 3] [--updates N] [--json FILE] [--micro]
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import math
import random
import statistics
import time
from dataclasses import dataclass

from scipy import stats

from posttrain.rollout.pool import Group, MaxStalenessOptions, PACEOptions, TrajectoryPool, group_staleness, pool_policies


@dataclass(frozen=True)
class CostModel:
    workers: int
    group_size: int
    batch_groups: int
    decode_step: float  # seconds per decode step of one worker's group
    median_tokens: float
    length_sigma: float
    max_tokens: int
    update: float  # seconds per trainer update
    sync: float  # seconds from publication to a worker's use of a version


def decode_versions(start: float, n: int, step: float, arrivals: list[float]) -> list[int]:
    """The version of each of n tokens decoded at start + step, start + 2 step, ...: the number of versions that
    reached the worker by then (`arrivals[k]`: when version k + 1 arrived, sorted)."""
    versions, done, v = [], 0, bisect.bisect_right(arrivals, start + step)
    for arrival in arrivals[v:]:
        switch = min(n, math.ceil((arrival - start) / step) - 1)  # the first token decoded at or after `arrival`
        versions += [v] * (switch - done)
        done, v = max(done, switch), v + 1
        if done >= n:
            break
    return versions + [v] * (n - done)


def make_policy(name: str, args):
    """The pool policy `name`; None for `sync` (no pool: the trainer waits for its batch)."""
    if name == "sync":
        return None
    if name == "max_staleness":
        return pool_policies.get(name)(MaxStalenessOptions(cap=args.cap))
    if name == "pace":
        return pool_policies.get(name)(PACEOptions(kappa=args.kappa, rho=args.rho, beta_g=args.beta_g, cap=0, order="fifo"))
    return pool_policies.get(name)()


def simulate_sync(model: CostModel, updates: int, seed: int) -> dict[str, float]:
    """Synchronous RL on the same cluster: each update the trainer hands its `batch_groups` prompts to the workers
    (round robin; a worker decodes its groups one after another), waits for the last group, trains, and the workers
    wait `sync` s for the new weights. Every token is at v_now (E = 0); no worker beyond `batch_groups` has work."""
    rng = random.Random(seed)
    now = blocked = 0.0
    pooled_tokens = 0
    for _ in range(updates):
        busy = [0.0] * min(model.workers, model.batch_groups)
        for g in range(model.batch_groups):
            lens = [max(1, min(model.max_tokens, round(model.median_tokens * math.exp(rng.gauss(0.0, model.length_sigma)))))
                    for _ in range(model.group_size)]
            busy[g % len(busy)] += max(lens) * model.decode_step
            pooled_tokens += sum(lens)
        generation = max(busy) + model.sync
        blocked += generation
        now += generation + model.update
    zero = {"E_mean": 0.0, "E_p95": 0.0, "W_mean": 0.0, "Gp_mean": 0.0, "Gn_mean": 0.0, "rejected_share": 0.0}
    return {**zero, "occupancy_mean": float(model.batch_groups), "trainer_idle_share": blocked / now,
            "groups_per_s": updates * model.batch_groups / now, "length_bias": 1.0, "E_hist": {"0": 1.0}}


def simulate(model: CostModel, policy, updates: int, seed: int) -> dict[str, float]:
    if policy is None:
        return simulate_sync(model, updates, seed)
    rng = random.Random(seed)
    published: list[float] = []  # publication time of version k + 1 at index k

    def lengths() -> list[int]:
        return [max(1, min(model.max_tokens, round(model.median_tokens * math.exp(rng.gauss(0.0, model.length_sigma)))))
                for _ in range(model.group_size)]

    events: list[tuple[float, int, int, tuple]] = []  # (time, kind 0 = update done / 1 = group done, tie, payload)
    tie = 0
    for _ in range(model.workers):
        start, lens = rng.uniform(0.0, model.median_tokens * model.decode_step), lengths()
        heapq.heappush(events, (start + max(lens) * model.decode_step, 1, tie := tie + 1, (start, lens)))
    pool, prompt = TrajectoryPool(), 0
    version, busy, idle_since, idle = 0, False, 0.0, 0.0
    trained: list = []
    pooled = rejected = 0
    pooled_tokens = trained_tokens = 0  # completion tokens per trajectory: a hard cap's bias against long rollouts
    occupancy: list[float] = []
    now = 0.0
    while version < updates:
        now, kind, _, payload = heapq.heappop(events)
        if kind == 0:
            version, busy, idle_since = version + 1, False, now
            published.append(now)
        else:
            start, lens = payload
            longest = decode_versions(start, max(lens), model.decode_step, [q + model.sync for q in published])
            rows = tuple(tuple(longest[:n]) for n in lens)  # the group decodes in lockstep: each row a prefix
            pool.add(Group(prompt, rows, tuple(r[-1] for r in rows)))
            prompt, pooled, pooled_tokens = prompt + 1, pooled + 1, pooled_tokens + sum(lens)
            lens = lengths()
            heapq.heappush(events, (now + max(lens) * model.decode_step, 1, tie := tie + 1, (now, lens)))
        if busy or version >= updates:
            continue
        draw = pool.draw(policy, version, model.batch_groups)
        rejected += len(draw.rejected)
        if draw.batch is None:
            continue
        occupancy.append(draw.figures["pool/occupancy"])
        trained += [group_staleness(g, version, policy.beta_g) for g in draw.batch]
        trained_tokens += sum(len(row) for g in draw.batch for row in g.token_versions)
        idle += now - idle_since
        busy = True
        heapq.heappush(events, (now + model.update, 0, tie := tie + 1, ()))
    effective = sorted(s.effective for s in trained)
    return {
        "E_mean": statistics.fmean(effective), "E_p95": effective[min(len(effective) - 1, int(0.95 * len(effective)))],
        "W_mean": statistics.fmean(s.waiting for s in trained), "Gp_mean": statistics.fmean(s.generation for s in trained),
        "Gn_mean": statistics.fmean(s.naive for s in trained), "rejected_share": rejected / max(pooled, 1),
        "occupancy_mean": statistics.fmean(occupancy), "trainer_idle_share": idle / now,
        "groups_per_s": len(trained) / now,
        "length_bias": (trained_tokens / len(trained)) / (pooled_tokens / pooled),  # < 1: long groups rejected more
        "E_hist": {str(k): v / len(effective) for k, v in sorted(_histogram(effective).items())},
    }


def _histogram(values: list[float]) -> dict[int, int]:
    out: dict[int, int] = {}
    for v in values:
        k = min(int(math.floor(v)), 8)  # 8: 8 or more versions
        out[k] = out.get(k, 0) + 1
    return out


def interval(values: list[float]) -> dict[str, float]:
    """Mean and 95% t interval of the mean over seeds."""
    mean = statistics.fmean(values)
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.inf
    return {"mean": mean, "low": mean - half, "high": mean + half}


def verdict_negative(diffs: list[float]) -> dict[str, float | str]:
    """A claim that a paired difference is negative: reproduced if the interval lies below 0, contradicted above."""
    ci = interval(diffs)
    return {**ci, "verdict": "reproduced" if ci["high"] < 0 else "contradicted" if ci["low"] >= 0 else "inconclusive"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[8, 64])
    p.add_argument("--policies", nargs="+", default=["sync", "none", "max_staleness", "pace"])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--updates", type=int, default=200)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--batch-groups", type=int, default=8)
    p.add_argument("--decode-step", type=float, default=0.02)
    p.add_argument("--median-tokens", type=float, default=150.0)
    p.add_argument("--length-sigma", type=float, default=0.8)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--update", type=float, default=8.0)
    p.add_argument("--sync", type=float, default=0.5)
    p.add_argument("--cap", type=int, default=4, help="max_staleness: versions")
    p.add_argument("--kappa", type=float, default=1.0, help="pace: P* = ceil(kappa * batch groups)")
    p.add_argument("--rho", type=float, default=1.0)
    p.add_argument("--beta-g", type=float, default=1.0)
    p.add_argument("--json", default=None)
    p.add_argument("--micro", action="store_true", help="a smoke run: 6 updates")
    args = p.parse_args()
    if args.micro:
        args.updates = 6
    t0 = time.time()
    results: dict[str, dict] = {}
    print(f"{'workers':>7} {'policy':>13} {'E mean':>20} {'E p95':>7} {'W':>6} {'Gp':>6} {'Gn':>6} {'rejected':>9} {'occup.':>7} {'idle':>6} {'grp/s':>6} {'len.bias':>8}")
    for workers in args.workers:
        model = CostModel(workers, args.group_size, args.batch_groups, args.decode_step, args.median_tokens,
                          args.length_sigma, args.max_tokens, args.update, args.sync)
        for name in args.policies:
            runs = [simulate(model, make_policy(name, args), args.updates, seed) for seed in range(args.seeds)]
            summary = {k: interval([r[k] for r in runs]) for k in runs[0] if k != "E_hist"}
            results[f"{workers}/{name}"] = {"workers": workers, "policy": name, "seeds": runs, "summary": summary}
            s = {k: v["mean"] for k, v in summary.items()}
            e = summary["E_mean"]
            print(f"{workers:>7} {name:>13} {e['mean']:6.2f} [{e['low']:5.2f},{e['high']:5.2f}] {s['E_p95']:7.2f} {s['W_mean']:6.2f} "
                  f"{s['Gp_mean']:6.2f} {s['Gn_mean']:6.2f} {s['rejected_share']:9.3f} {s['occupancy_mean']:7.1f} "
                  f"{s['trainer_idle_share']:6.3f} {s['groups_per_s']:6.3f} {s['length_bias']:8.3f}", flush=True)
    verdicts = {}
    for workers in args.workers:
        if {f"{workers}/pace", f"{workers}/none"} <= set(results):
            pace, none = results[f"{workers}/pace"]["seeds"], results[f"{workers}/none"]["seeds"]
            verdicts[f"{workers}: pace E_mean - none E_mean < 0"] = verdict_negative([a["E_mean"] - b["E_mean"] for a, b in zip(pace, none)])
        if {f"{workers}/pace", f"{workers}/max_staleness"} <= set(results):
            pace, cap = results[f"{workers}/pace"]["seeds"], results[f"{workers}/max_staleness"]["seeds"]
            verdicts[f"{workers}: max_staleness length_bias - pace length_bias < 0"] = verdict_negative(
                [b["length_bias"] - a["length_bias"] for a, b in zip(pace, cap)])
        if {f"{workers}/pace", f"{workers}/sync"} <= set(results):  # the cluster's clock: throughput, trainer blocked on generation
            pace, sync = results[f"{workers}/pace"]["seeds"], results[f"{workers}/sync"]["seeds"]
            verdicts[f"{workers}: sync groups_per_s - pace groups_per_s < 0"] = verdict_negative(
                [b["groups_per_s"] - a["groups_per_s"] for a, b in zip(pace, sync)])
            verdicts[f"{workers}: pace trainer_idle_share - sync trainer_idle_share < 0"] = verdict_negative(
                [a["trainer_idle_share"] - b["trainer_idle_share"] for a, b in zip(pace, sync)])
        for name in args.policies:
            if name == "sync":
                continue
            runs = results[f"{workers}/{name}"]["seeds"]
            verdicts[f"{workers}/{name}: Gp_mean - Gn_mean < 0"] = verdict_negative([r["Gp_mean"] - r["Gn_mean"] for r in runs])
    for claim, v in verdicts.items():
        print(f"{claim}: {v['mean']:.3f} [{v['low']:.3f}, {v['high']:.3f}] -> {v['verdict']}")
    out = {"claim": "async_simulator", "updates": args.updates, "seeds": args.seeds, "args": vars(args),
           "results": results, "verdicts": verdicts, "runtime_s": time.time() - t0}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
