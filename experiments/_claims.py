"""The claims harness: every claim experiment runs each arm on each of `--seeds N` seeds (default 3) and reports, per
compared quantity, each side's mean with a 95% t-interval, the per-seed values, the paired difference's interval
and a verdict:

    reproduced     the difference's 95% interval excludes 0 in the claimed direction
    contradicted   it excludes 0 in the other direction
    inconclusive   it contains 0 (or fewer than 2 seeds)

A claim experiment's `__main__` calls `run_seeds(main, claim)`: `main` (the one-seed experiment, unchanged) runs once
per seed `--seed .. --seed + N - 1` with its JSON to a temporary file; the per-seed results, the comparisons and the
command go to `--json`. MLflow: one parent run per claim (named after it, summary metrics and the comparison
table), one child run per arm x seed (the arm's per-step and final metrics; `_common.log_arm`).
`experiments/claims.py` runs one claim or all of them into experiments/results/, from which docs/generate.py writes
the table in docs/claims.md.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, also when this file is loaded by path
import _premises as premises  # noqa: E402

# what the running claim is, for `_common.log_arm` (parent / child MLflow runs); empty outside the harness
CURRENT: dict = {}


@dataclass(frozen=True)
class Compare:
    """One claimed difference: `better` beats `worse` on `metric` (higher is better unless `lower`).
    `better` / `worse` read a number from one seed's results JSON."""

    metric: str
    better: str
    worse: str
    get_better: Callable[[dict], float]
    get_worse: Callable[[dict], float]
    lower: bool = False
    construction_check: bool = False  # holds by the setup's construction: shown and given a verdict, not counted for the method


def row(arm: str, column: str, key: str = "arm") -> Callable[[dict], float]:
    """The `column` of the results table's row for `arm`."""
    return lambda r: float(next(x[column] for x in r["table"] if x[key] == arm))


def compare(metric: str, better: str, worse: str, column: str | None = None, lower: bool = False, key: str = "arm",
            construction_check: bool = False) -> Compare:
    """`better` vs `worse` on the results table's `column` (default: `metric`)."""
    column = column or metric
    return Compare(metric, better, worse, row(better, column, key), row(worse, column, key), lower, construction_check)


HELDOUT = "heldout_greedy_after"
# samplers_compare.py (issue 16), on either dataset: PPT vs power, TTSD vs temperature and beam, the contexts, sampling vs RL
SAMPLERS = [compare("accuracy", "ppt", "power_matched"), compare("accuracy", "ppt", "power"), compare("accuracy", "ttsd", "temperature"),
            compare("accuracy", "ttsd", "temperature_vote"), compare("accuracy", "ttsd", "beam"), compare("accuracy", "ttsd", "beam_wide"),
            compare("accuracy", "context_positive", "context_plain"), compare("accuracy", "context_plain", "context_negative"),
            compare("accuracy", "ppt", "rl_greedy"), compare("accuracy", "power", "rl_greedy")]
ASYNC = [compare("acc_equal_time", "async_pace", "async_none"), compare("time_to_target", "async_pace", "async_none", lower=True),
         compare("acc_equal_time", "async_pace", "sync"), compare("time_to_target", "async_pace", "sync", lower=True),
         compare(HELDOUT, "async_pace", "async_none"), compare("acc_equal_groups", "async_pace", "async_none"),
         compare(HELDOUT, "async_pace", "sync"), compare("gen_wait_s", "async_pace", "sync", lower=True),
         compare(HELDOUT, "async_pace", "async_max_staleness")]
# asct_vs_ppo.py (issue 19): ASCT's tree credit vs trajectory-return PPO and vs a Monte-Carlo value baseline at matched
# auxiliary tokens, on the held-out greedy actor and on episodes sampled from it (issue 34: the credit arms can end at one
# greedy policy while their distributions differ); the cost-aware tree policy vs the uniform one (utility, tokens spent)
ASCT = [compare("utility", "asct", "trajectory"), compare("utility", "asct", "mc_value"), compare("utility", "asct_agent_uct", "trajectory"),
        compare("utility", "asct_agent_uct", "asct"), compare("f1", "asct", "trajectory"), compare("f1", "asct", "mc_value"),
        compare("aux_tokens", "asct_agent_uct", "asct", lower=True), compare("sampled_utility", "asct", "trajectory"),
        compare("sampled_utility", "asct", "mc_value"), compare("sampled_utility", "asct_agent_uct", "asct")]
FLOW = [compare(metric, better, worse) for better, worse in (("gdpo", "sft"), ("sum_then_normalize", "sft"), ("gdpo", "sum_then_normalize"))
        for metric in ("overall", "ia", "bp", "qp")]
# claim (the script stem, or a claims.py CLAIMS name when one script runs several) -> the differences it claims
COMPARISONS: dict[str, list[Compare]] = {
    "bridge_vs_baselines": [compare("em", "bridge", "frozen"), compare("em", "bridge", "naive"), compare("em", "bridge", "policy_first"),
                            compare("recall", "bridge", "frozen"), compare("recall", "bridge", "naive"),
                            compare("recall", "bridge", "policy_first"), compare("train_em", "bridge", "frozen"),
                            compare("train_recall", "bridge", "frozen")],
    "witness_vs_grpo": [compare("tv_after", "witness_reward", "grpo", lower=True), compare("tv_after", "witness_raw", "grpo", lower=True),
                        compare("tv_after", "witness_raw", "witness_reward", lower=True)],
    "gdpo_vs_sum": [compare("d_correctness", "gdpo", "sum_then_normalize"), compare("heldout_greedy_after", "gdpo", "sum_then_normalize")],
    "respo_vs_clip": [compare("train_acc_last", "respo", "clip"), compare(HELDOUT, "respo", "clip")],
    "qglas_vs_quality": [compare("items_after", "qglas", "quality_only", lower=True), compare("hit1_after", "qglas", "quality_only")],
    "gats_vs_opd": [compare("train_acc_first", "gats", "grpo"), compare(HELDOUT, "gats", "opd_const")],
    "sipo_vs_grpo": [compare("train_acc_last", "sipo", "grpo"), compare(HELDOUT, "sipo", "grpo")],
    "ride_vs_oprd": [compare(HELDOUT, "ride", "oprd"), compare(HELDOUT, "ride", "output_space")],
    "pr_opd_text_world": [compare("heldout_sampled_after", "pr_opd", "grpo"), compare("train_acc_last", "pr_opd", "grpo"),
                          compare("heldout_sampled_after", "uniopsd", "grpo"), compare("train_acc_last", "uniopsd", "grpo")],
    "reward_model_rl": [Compare(HELDOUT, "bt", "start", row("bt", HELDOUT), row("bt", "heldout_greedy_before")),
                        Compare(HELDOUT, "trm", "start", row("trm", HELDOUT), row("trm", "heldout_greedy_before")),
                        compare(HELDOUT, "verifier", "bt"),
                        Compare(HELDOUT, "bt_disjoint", "start", row("bt_disjoint", HELDOUT), row("bt_disjoint", "heldout_greedy_before")),
                        Compare(HELDOUT, "trm_disjoint", "start", row("trm_disjoint", HELDOUT), row("trm_disjoint", "heldout_greedy_before")),
                        # the memorised-verifier effect: a reward model taught the RL prompts' answers should pay more than one that never saw them
                        compare(HELDOUT, "bt", "bt_disjoint"), compare(HELDOUT, "trm", "trm_disjoint"),
                        compare(HELDOUT, "verifier", "trm"),
                        # the guards against over-optimising the learned reward, each against plain bt
                        compare(HELDOUT, "bt_kl", "bt"), compare(HELDOUT, "bt_clip", "bt"), compare(HELDOUT, "bt_format", "bt")],
    "think_opd_worked_steps": [compare(HELDOUT, "think_opd", "uniform"), compare(HELDOUT, "think_opd", "opd"),
                               Compare("trd", "cross_route", "same_route", lambda r: r["route_compatibility"]["trd_cross_route"],
                                       lambda r: r["route_compatibility"]["trd_same_route"])],
    "trm_anti_polarisation": [compare("extreme_fraction", "pd_grpo", "pairwise_margin", lower=True),
                              compare("pair_accuracy", "pd_grpo", "pairwise_margin")],
    "gm_dpo_flexbench": [compare("greedy_gpa", "gm_dpo", "dpo", key="objective"), compare("greedy_whr", "gm_dpo", "dpo", lower=True, key="objective")],
    "abc_align_pseudo_labels": [compare("heldout_pair_acc", "abc_align", "pseudo_only"), compare("heldout_pair_acc", "abc_align", "gold_only"),
                                compare("heldout_pair_acc", "abc_align", "ppi")],  # ppi: the same correction at alpha = 1
    "glime_vs_naive": [compare("generalization", "glime", "naive"), compare("retention", "glime", "naive"),
                       compare("locality", "glime", "naive"),
                       # the same paraphrase prompts for the naive fine-tuning: GLIME's gain beyond the prompts it sees
                       compare("generalization", "glime", "naive_paraphrase"), compare("retention", "glime", "naive_paraphrase"),
                       compare("locality", "glime", "naive_paraphrase")],
    "care_dialogue": [compare("true_quality_after", "generator", "uniform", key="weights")],
    "safe_rl_vlm": [compare("catastrophe_rate", "ppo_lag", "ppo", lower=True), compare("cost", "ppo_lag", "ppo", lower=True),
                    compare("progress", "ppo", "ppo_lag"), compare("catastrophe_rate", "ppo_lag_vlm", "ppo_lag", lower=True),
                    compare("lambda_mean", "ppo_lag_vlm", "ppo_lag_vlm_kappa0"),
                    compare("catastrophe_rate", "ppo_lag_vlm", "ppo_lag_vlm_kappa0", lower=True)],
    # kgpo_vs_hit1.py (issue 39): RareDx-KGPO's graded reward vs the Hit@1 reward it refines, same GRPO budget, held-out greedy
    "kgpo_vs_hit1": [compare("hit1_after", "kgpo", "hit1"), compare("hit3_after", "kgpo", "hit1"), compare("graded_after", "kgpo", "hit1")],
    # audit_selective_control.py (issue 39): RLVR on an exploitable verifier (audit rate 0) raises its acceptance while
    # correctness falls; the audit-corrected reward at rho 0.1 / 0.3 lowers the accepted-error rate and keeps correctness
    "audit_selective_control": [compare("train_accepted", "verifier", "start"), compare("train_accepted_error", "verifier", "start"),
                                compare("train_correct", "start", "verifier"),
                                *[compare(m, audit, "verifier", lower=m.endswith("accepted_error")) for audit in ("audit_0.1", "audit_0.3")
                                  for m in ("train_accepted_error", "train_correct", "heldout_accepted_error", "heldout_correct")]],
    "sdrl_strategies": [compare("distinct_strategies", "sdrl", "correctness"), compare("strategy_entropy", "sdrl", "correctness"),
                        compare("heldout_success", "sdrl", "correctness")],
    "motion_vs_rgb": [compare("rho_consistency", "motion", "rgb"), compare("rho_continuity", "motion", "rgb"),
                      compare("rho_plausibility", "motion", "rgb"), compare("cause_f1", "motion", "rgb"),
                      Compare("reward", "motion_grpo", "motion_sft", row("motion", "reward"), row("motion", "sft_reward"))],
    "aura_ppo": [compare("score", "ppo", "sft"), compare("directional_accuracy", "ppo", "sft"), compare("magnitude_agreement", "ppo", "sft")],
    # PPO and GRPO each from the same SFT start (after vs before), then PPO vs GRPO (a one-sided row: a match reads as
    # an inconclusive verdict with a narrow interval around 0)
    "ppo_vs_grpo": [Compare(HELDOUT, "ppo", "sft", row("ppo", HELDOUT), row("ppo", "heldout_greedy_before")),
                    Compare(HELDOUT, "grpo", "sft", row("grpo", HELDOUT), row("grpo", "heldout_greedy_before")),
                    compare(HELDOUT, "ppo", "grpo")],
    # RFPO (no verifier in RL) vs its start and supervised PPO; binarised vs raw score, and the raw score's length exploit
    "rfpo_vs_ppo": [Compare(HELDOUT, "rfpo", "sft", row("rfpo", HELDOUT), row("rfpo", "heldout_greedy_before")),
                    compare(HELDOUT, "rfpo", "ppo"), compare(HELDOUT, "rfpo", "rfpo_raw"),
                    compare("len_last", "rfpo", "rfpo_raw", lower=True)],
    # async RL (issue 17): PACE vs unfiltered async at equal wall clock and to a target; PACE vs sync at equal steps (a
    # match reads as inconclusive with a narrow interval) and on the trainer's time blocked on generation
    "async_pace": ASYNC,
    "async_pace_deterministic": ASYNC,
    "asct_vs_ppo": ASCT,
    "asct_vs_ppo_short": ASCT,  # the same arms at a short budget (12 rounds): does the tree's credit learn sooner?
    "asct_lm_vs_ppo": ASCT,  # the same arms with the language model as the actor (recipes/search/asct_actors.py `lm`)
    # VisKG (specs §29): GDPO vs GRPO from the same SFT start; the question graph vs the full caption on accuracy. The
    # token row is a construction check, not a claim about the method: the graph is a sub-path of the caption's triples,
    # so a model that writes either as taught writes fewer tokens with the graph
    "viskg_gdpo_vs_grpo": [compare("accuracy", "gdpo", "grpo"), compare("accuracy", "gdpo", "caption_gdpo"),
                           compare("tokens (construction check)", "gdpo", "caption_gdpo", column="tokens", lower=True, construction_check=True)],
    # DSP (issue 20): CFG subgoals vs flat BC and value-guided subgoals; the guidance sweep omega 2 > 1 > 0
    "dsp_vs_baselines": [compare("success", "dsp_w2", "flat_bc"), compare("success", "dsp_w2", "value_guided"),
                         compare("success", "dsp_w2", "dsp_w1"), compare("success", "dsp_w1", "dsp_w0"),
                         compare("subgoal_progress", "dsp_w2", "dsp_w0")],
    "samplers_arithmetic": SAMPLERS,
    "samplers_word_problems": SAMPLERS,
    # smollm2_samplers.py (issue 39): the same samplers on the real checkpoint, no training (so no RL row); power
    # sampling against the temperature sampling it sharpens
    "smollm2_samplers": [*SAMPLERS[:8], compare("accuracy", "power", "temperature")],
    # smollm2_ttsd_reward.py (issue 39): TTSD's log-odds reward as a best-of-N pick over the same temperature samples of the
    # real checkpoint: against one sample, the likelihood pick and the vote; the Gibbs target's score against the likelihood
    "smollm2_ttsd_reward": [compare("accuracy", "log_odds", "temperature"), compare("accuracy", "tilted", "temperature"),
                            compare("accuracy", "tilted", "likelihood"), compare("accuracy", "log_odds", "vote"),
                            compare("accuracy", "likelihood", "temperature")],
    # smollm2_rl.py (issue 32): GRPO from SmolLM2-135M-Instruct against its start, held-out greedy (and sampled) accuracy
    "smollm2_rl": [compare("wp_greedy_accuracy", "rl", "base"), compare("wp_greedy_accuracy_steps_1", "rl", "base"),
                   compare("wp_greedy_accuracy_steps_2", "rl", "base"), compare("ar_greedy_accuracy", "rl", "base"),
                   compare("wp_sampled_accuracy", "rl", "base"), compare("wp_greedy_format_rate", "rl", "base")],
    # smollm2_sft_rl.py (issue 32): an SFT warm-up on worked solutions, then the same GRPO; two-step problems above all
    "smollm2_sft_rl": [compare(m, better, worse) for better, worse in (("sft_rl", "base"), ("sft_rl", "sft"), ("sft", "base"))
                       for m in ("wp_greedy_accuracy_steps_2", "wp_greedy_accuracy_steps_1", "wp_greedy_accuracy", "ar_greedy_accuracy")],
    # ... RL at lr 5e-6: what examples/smollm2 (make run) runs, so its rows against the checkpoint are make run's figures
    "smollm2_sft_rl_low_lr": [compare(m, "sft_rl", worse) for worse in ("sft", "base")
                              for m in ("wp_greedy_accuracy_steps_2", "wp_greedy_accuracy_steps_1", "wp_greedy_accuracy", "ar_greedy_accuracy")],
    # smollm2_objectives.py (issue 39): each method's claim against GRPO (std-scaled advantage, sequence-mean loss) on the
    # real checkpoint at one budget; `example` is examples/smollm2's objective (no std division, token-mean loss)
    "smollm2_objectives": [*[compare(m, arm, "grpo") for arm in ("example", "dr_grpo", "dapo", "gspo", "max_rl", "remax")
                             for m in ("wp_greedy_accuracy", "wp_greedy_accuracy_steps_1")],
                           compare("wp_greedy_accuracy", "max_rl", "example"),  # MaxRL changes only the example's advantage
                           compare("wp_greedy_accuracy", "remax", "example"),  # ... and so does ReMax
                           # QGLAS (seed method 21) on the example's advantage: shorter answers at no cost in accuracy
                           compare("completion_length_last", "qglas", "example", lower=True), compare("wp_greedy_accuracy", "qglas", "example"),
                           compare("completion_length_last", "dr_grpo", "grpo", lower=True),  # Dr. GRPO: no length bias toward long wrong answers
                           compare("wp_sampled_accuracy", "dapo", "grpo")],
    # smollm2_self_distill.py (issue 39): SIPO (the example's advantage + the contrastive self-teacher's token
    # redistribution) and OPSD (reverse KL to the policy told the answer, no reward) against the example's objective, the
    # baseline SIPO builds on, and against GRPO; SIPO's own claim is about all-fail groups, its row the signal there
    "smollm2_sipo": [compare(m, "sipo", base) for base in ("example", "grpo") for m in ("wp_greedy_accuracy", "wp_sampled_accuracy")],
    "smollm2_opsd": [compare(m, "opsd", base) for base in ("example", "grpo") for m in ("wp_greedy_accuracy", "wp_sampled_accuracy")],
    # ROFT (retrospection-only NLL) vs GRPO at the same updates and attempts from the same start; each against its start
    "roft_vs_grpo": [compare(HELDOUT, "roft", "grpo"),
                     Compare(HELDOUT, "roft", "sft", row("roft", HELDOUT), row("roft", "heldout_greedy_before")),
                     Compare(HELDOUT, "grpo", "sft", row("grpo", HELDOUT), row("grpo", "heldout_greedy_before"))],
    # flow_gdpo_vs_sum.py (issues 34, 39): CrossTimeEdit's Flow-GRPO from the flow_sft model, each RL arm against that
    # start (the SFT -> RL gain), then GDPO vs sum_then_normalize; the overall score mean(IA, BP, QP) and each judge.
    # An SFT model per seed, and (_one_sft) one SFT model for every seed: the spread of RL and evaluation noise alone
    "flow_gdpo_vs_sum": FLOW,
    "flow_gdpo_vs_sum_one_sft": FLOW,
}


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student-t interval of the mean; (mean, nan, nan) with fewer than 2 values."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def verdict(low: float, high: float, lower_is_better: bool) -> str:
    """The difference better - worse: reproduced when its interval excludes 0 on the claimed side."""
    if math.isnan(low):
        return "inconclusive"
    if lower_is_better:
        low, high = -high, -low
    return "reproduced" if low > 0 else "contradicted" if high < 0 else "inconclusive"


def summarise(claim: str, per_seed: list[dict], seeds: list[int] | None = None) -> list[dict]:
    """One row per claimed difference: each side's mean and interval, the per-seed values, the paired difference,
    and the verdict, given only over the seeds where the claim's premises (experiments/_premises.py) held, and only
    when at least `MIN_SEEDS` did (`premise failed` otherwise; `too few seeds` when none failed but the run has fewer).
    Two arms equal on every seed are `identical arms`:
    no comparison at all."""
    seeds = list(range(len(per_seed))) if seeds is None else seeds
    checks = premises.check(claim, per_seed)
    declared = bool(premises.PREMISES.get(claim))
    out = []
    for c in COMPARISONS.get(claim, []):
        try:
            better, worse = [c.get_better(r) for r in per_seed], [c.get_worse(r) for r in per_seed]
        except StopIteration:  # an arm the run left out (e.g. reward_model_rl --arms): nothing to compare
            print(f"{claim}: {c.metric} {c.better} vs {c.worse} skipped (an arm was not run)", flush=True)
            continue
        held, failures = premises.held_seeds(checks, seeds, c.better, c.worse)
        enough = len(held) >= premises.MIN_SEEDS
        used = held if enough else list(range(len(per_seed)))  # the figures shown: the seeds the verdict rests on
        b, w = [better[i] for i in used], [worse[i] for i in used]
        diff = [x - y for x, y in zip(b, w)]
        mb, lb, hb = t_interval(b)
        mw, lw, hw = t_interval(w)
        md, ld, hd = t_interval(diff)
        if better == worse:
            decided = "identical arms"
        elif not enough and len(held) == len(per_seed):  # nothing failed: the run has too few seeds for a verdict
            decided = f"too few seeds ({len(held)}, at least {premises.MIN_SEEDS} needed)"
        elif not enough:
            decided = f"premise failed ({len(held)} of {len(per_seed)} seeds held)"
        else:
            decided = verdict(ld, hd, c.lower)
        out.append({"metric": c.metric, "better": c.better, "worse": c.worse, "direction": "lower" if c.lower else "higher",
                    "better_mean": mb, "better_ci": [lb, hb], "better_values": better,
                    "worse_mean": mw, "worse_ci": [lw, hw], "worse_values": worse,
                    "diff_mean": md, "diff_ci": [ld, hd], "verdict": decided,
                    "premise": {"declared": declared, "held_seeds": [seeds[i] for i in held], "seeds_used": [seeds[i] for i in used],
                                "failures": failures}, **({"construction_check": True} if c.construction_check else {})})
    return out


def premise_table(claim: str, per_seed: list[dict], seeds: list[int]) -> list[dict]:
    """Every declared premise's measured value on every seed, for the results JSON."""
    return [{"seed": seed, **check} for seed, seed_checks in zip(seeds, premises.check(claim, per_seed)) for _, check in seed_checks]


def fmt_ci(mean: float, ci: list[float]) -> str:
    return f"{mean:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}]" if not math.isnan(ci[0]) else f"{mean:+.4f}"


def print_summary(claim: str, seeds: list[int], rows: list[dict]) -> str:
    lines = [f"\n{claim}: {len(seeds)} seeds {seeds}, 95% t-intervals"]
    for r in rows:
        cmp = "<" if r["direction"] == "lower" else ">"
        lines.append(f"  {r['metric']}: claimed {r['better']} {cmp} {r['worse']}")
        lines.append(f"    {r['better']:>16}: {fmt_ci(r['better_mean'], r['better_ci'])}  per seed {[round(v, 4) for v in r['better_values']]}")
        lines.append(f"    {r['worse']:>16}: {fmt_ci(r['worse_mean'], r['worse_ci'])}  per seed {[round(v, 4) for v in r['worse_values']]}")
        lines.append(f"    {'difference':>16}: {fmt_ci(r['diff_mean'], r['diff_ci'])}  -> {r['verdict']}")
    text = "\n".join(lines)
    print(text, flush=True)
    return text


@dataclass
class _Args:
    seeds: int
    seed: int
    json: Path | None
    rest: list[str] = field(default_factory=list)


def _split(argv: list[str]) -> _Args:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    known, rest = p.parse_known_args(argv)
    if known.seeds < 1:
        raise SystemExit("--seeds must be >= 1")
    return _Args(known.seeds, known.seed, known.json, rest)


def run_seeds(main: Callable[[], None], claim: str, argv: list[str] | None = None, script: str | None = None,
              figure: Callable[[list[dict]], tuple] | None = None) -> dict:
    """Run the one-seed experiment `main` on each seed and write the claim's results (see the module docstring).
    `figure(per_seed) -> (matplotlib figure, artifact name)`, when given, goes to the claim's parent run."""
    argv = list(sys.argv[1:] if argv is None else argv)
    script = script or sys.argv[0]
    if "-h" in argv or "--help" in argv:
        sys.argv = [script, *argv]
        main()
        return {}
    a = _split(argv)
    seeds = list(range(a.seed, a.seed + a.seeds))
    per_seed = []
    saved = sys.argv
    CURRENT.clear()
    CURRENT.update(claim=claim, parent=None, cfg=None)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for s in seeds:
                out = Path(tmp) / f"seed{s}.json"
                sys.argv = [script, *a.rest, "--seed", str(s), "--json", str(out)]
                CURRENT["seed"] = s
                print(f"=== {claim}: seed {s} ({seeds.index(s) + 1}/{len(seeds)})", flush=True)
                main()
                per_seed.append(json.loads(out.read_text()))
        rows = summarise(claim, per_seed, seeds)
        text = print_summary(claim, seeds, rows)
        parent = _log_parent(rows, text, figure(per_seed) if figure else None)
    finally:
        sys.argv = saved
        CURRENT.clear()
    command = " ".join(shlex.quote(x) for x in [".venv/bin/python", f"experiments/{Path(script).name}", *reproducible(argv)])
    results = {"claim": claim, "seeds": seeds, "command": command, "comparisons": rows, "premises": premise_table(claim, per_seed, seeds),
               "mlflow_parent_run": parent, "per_seed": per_seed}
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {a.json}")
    return results


def _without_seeds(command: str) -> list[str]:
    """A recorded command less its --seed / --seeds / --json flags: what decides each seed's results."""
    words, out, skip = shlex.split(command), [], False
    for word in words:
        if skip:
            skip = False
        elif word in ("--seed", "--seeds", "--json"):
            skip = True
        else:
            out.append(word)
    return out


def merge(results: list[dict], json_path: Path | None = None) -> dict:
    """One claim's results from several runs of the same command on different seeds (`--seed S --seeds 1` in
    parallel processes or on several machines), as one `--seeds N` run over all of them would write: the per-seed
    results in seed order, the comparisons over them, the command with `--seed` / `--seeds` of the whole range.
    Refuses runs of different claims or commands, a seed twice, or seeds that are not one contiguous range."""
    if not results:
        raise SystemExit("merge: no results given")
    claims, commands = {r["claim"] for r in results}, {tuple(_without_seeds(r["command"])) for r in results}
    if len(claims) != 1:
        raise SystemExit(f"merge: results of different claims {sorted(claims)}")
    if len(commands) != 1:
        raise SystemExit("merge: results of different commands: " + " | ".join(shlex.join(c) for c in sorted(commands)))
    pairs = sorted((s, one) for r in results for s, one in zip(r["seeds"], r["per_seed"]))
    seeds = [s for s, _ in pairs]
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"merge: a seed appears twice in {seeds}")
    if seeds != list(range(seeds[0], seeds[0] + len(seeds))):
        raise SystemExit(f"merge: seeds {seeds} are not one contiguous range")
    claim, per_seed = claims.pop(), [one for _, one in pairs]
    rows = summarise(claim, per_seed, seeds)
    print_summary(claim, seeds, rows)
    words = [*commands.pop(), *([] if seeds[0] == 0 else ["--seed", str(seeds[0])]), "--seeds", str(len(seeds))]
    words = reproducible([*words, *(["--json", str(json_path)] if json_path else [])])
    return {"claim": claim, "seeds": seeds, "command": shlex.join(words), "comparisons": rows,
            "premises": premise_table(claim, per_seed, seeds), "mlflow_parent_run": None,
            "per_seed": per_seed, "merged_from": [r["command"] for r in results]}


def reproducible(argv: list[str]) -> list[str]:
    """The flags that decide the results, for the recorded command: without --tracking-uri (where it logged), and
    with a --json path inside the checkout made relative to it."""
    repo, out, skip = Path(__file__).resolve().parents[1], [], False
    for i, flag in enumerate(argv):
        if skip:
            skip = False
        elif flag == "--tracking-uri":
            skip = True
        elif i > 0 and argv[i - 1] == "--json" and Path(flag).is_absolute() and Path(flag).resolve().is_relative_to(repo):
            out.append(str(Path(flag).resolve().relative_to(repo)))
        else:
            out.append(flag)
    return out


def parent_run(cfg) -> str | None:
    """The claim's parent MLflow run (opened once, on the first child); None outside the harness."""
    if not CURRENT.get("claim") or not cfg.tracking.enabled:
        return None
    if CURRENT["parent"] is None:
        from posttrain.tracking import stage_run

        with stage_run(cfg, CURRENT["claim"], "experiments", extra_tags={"claim": CURRENT["claim"]}) as tracker:
            CURRENT["parent"], CURRENT["cfg"] = tracker.run_id, cfg
    return CURRENT["parent"]


def _log_parent(rows: list[dict], text: str, figure: tuple | None = None) -> str | None:
    if CURRENT.get("parent") is None:
        return None
    from posttrain.tracking import stage_run

    with stage_run(CURRENT["cfg"], CURRENT["claim"], "experiments", run_id=CURRENT["parent"]) as tracker:
        metrics = {}
        for i, r in enumerate(rows):
            tag = f"{i}_{r['metric']}_{r['better']}_vs_{r['worse']}".replace(" ", "_")
            metrics.update({f"{tag}_diff_mean": r["diff_mean"], f"{tag}_diff_low": r["diff_ci"][0], f"{tag}_diff_high": r["diff_ci"][1]})
        tracker.log_metrics({k: v for k, v in metrics.items() if not math.isnan(v)})
        tracker.log_table([{k: (json.dumps(v) if isinstance(v, list) else v) for k, v in r.items()} for r in rows], "claims_table.json")
        tracker.log_text(text, "claims_summary.txt")
        if figure is not None:
            tracker.log_figure(*figure)
    return CURRENT["parent"]
