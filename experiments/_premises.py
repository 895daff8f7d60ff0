"""What each claim's comparison needs before it can mean anything, measured on every seed (issue 34).

A `Premise` reads one number from one seed's results JSON (a teacher's lead over its student, a critic's held-out
AUC, a start away from floor and ceiling, a method's own signal) and holds when the number clears its bound. The
harness (`_claims.summarise`) computes a comparison's verdict only over the seeds where every premise that concerns
its arms held, and only when at least `MIN_SEEDS` did; otherwise the row reads `premise failed`. A number the
experiment never recorded fails its premise as `not recorded`: nothing is assumed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

MIN_SEEDS = 3  # seeds whose premises held, below which no verdict is given


@dataclass(frozen=True)
class Premise:
    """`measure(one seed's results) -> number` must be >= `at_least` (and/or <= `at_most`). `arms`: the comparisons
    it concerns (a row whose better or worse arm is one of them); empty = every row of the claim. `pair`, when given
    instead, narrows it to the rows comparing exactly those two arms (either way round)."""

    name: str
    measure: Callable[[dict], float | None]
    at_least: float | None = None
    at_most: float | None = None
    arms: tuple[str, ...] = ()
    pair: tuple[str, str] | None = None

    def describe(self) -> str:
        bounds = [f">= {self.at_least:g}" if self.at_least is not None else "", f"<= {self.at_most:g}" if self.at_most is not None else ""]
        return f"{self.name} {' and '.join(b for b in bounds if b)}"

    def concerns(self, better: str, worse: str) -> bool:
        if self.pair is not None:
            return {better, worse} == set(self.pair)
        return not self.arms or better in self.arms or worse in self.arms

    def check(self, result: dict) -> dict:
        try:
            value = self.measure(result)
        except (KeyError, IndexError, StopIteration, TypeError):
            value = None
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return {"premise": self.describe(), "value": None, "held": False}
        value = float(value)
        held = (self.at_least is None or value >= self.at_least) and (self.at_most is None or value <= self.at_most)
        return {"premise": self.describe(), "value": value, "held": held}


def _row(result: dict, arm: str, column: str, key: str = "arm") -> float:
    return float(next(r[column] for r in result["table"] if r[key] == arm))


def _lead(ahead: str, behind: str) -> Callable[[dict], float]:
    """Held-out greedy accuracy of `ahead` minus `behind` (two `*_heldout` blocks of the results)."""
    return lambda r: r[ahead]["greedy_accuracy"] - r[behind]["greedy_accuracy"]


def _recorded(*path: str) -> Callable[[dict], float | None]:
    def read(r: dict):
        for key in path:
            r = r[key]
        return r
    return read


TEACHER_MARGIN = 0.05  # a teacher must beat its student's start by 5 points of held-out accuracy to teach it anything
FLOOR = 0.05  # a student below 5% held-out accuracy gives RL or distillation almost no correct sample to work from

MOVED = 1e-3  # a model trained off its start by less than a thousandth of its weights' norm has barely been trained
REDRAWN = 1 / 255  # images that differ by less than one 8-bit grey level on average are, as images, the same

# smollm2_self_distill.py: the checkpoint told the reference answer (the self-teacher's context) against plain, one
# measurement for every seed (the same weights and problems)
SELF_TEACHER_READS_THE_HINT = Premise("checkpoint's held-out greedy told the reference answer minus plain", _recorded("teacher", "lead"), at_least=0.10)

SFT_SOLVES_TWO_STEP = Premise("SFT start's held-out greedy on two-step problems", lambda r: _row(r, "sft", "wp_greedy_accuracy_steps_2"),
                              at_least=FLOOR, arms=("sft_rl",))

# CrossTimeEdit (flow_gdpo_vs_sum): each RL arm moved off the SFT model and the two off each other (weights, and the
# images they draw from the same noise), and every judge has room both ways at the SFT start
FLOW = [
    *[p for arm in ("gdpo", "sum_then_normalize") for p in (
        Premise(f"{arm}'s weights' relative L2 distance from the SFT model's", _recorded("arms", arm, "param_distance_from_sft"),
                at_least=MOVED, arms=(arm,)),
        Premise(f"{arm}'s images minus the SFT model's, same noise (mean |pixel difference|)",
                _recorded("arms", arm, "image_difference_from_sft"), at_least=REDRAWN, arms=(arm,)))],
    Premise("relative L2 distance between the two RL arms' weights", _recorded("between_rl_arms", "param_distance"), at_least=MOVED,
            pair=("gdpo", "sum_then_normalize")),
    Premise("the two RL arms' images, same noise (mean |pixel difference|)", _recorded("between_rl_arms", "image_difference"),
            at_least=REDRAWN, pair=("gdpo", "sum_then_normalize")),
    *[Premise(f"SFT start's held-out {judge.upper()} (floor and ceiling)", _recorded("sft", judge), at_least=FLOOR, at_most=1 - FLOOR)
      for judge in ("ia", "bp", "qp")],
]

def _relative_gap(column: str, a: str, b: str) -> Callable[[dict], float]:
    """|a - b| / |b| of one results-table column (each arm one row)."""
    return lambda r: abs(_row(r, a, column) - _row(r, b, column)) / max(abs(_row(r, b, column)), 1e-12)


# the cost-aware tree policy is compared with the uniform one only where their searches differed (with n_sim at most the
# legal actions, both visit every action once, in the same order: the same tree, token for token)
ASCT_SEARCHES_DIFFER = Premise("AgentUCT's and the uniform tree's auxiliary tokens, relative gap", _relative_gap("aux_tokens", "asct_agent_uct", "asct"),
                               at_least=0.01, pair=("asct_agent_uct", "asct"))

PREMISES: dict[str, list[Premise]] = {
    "asct_vs_ppo": [ASCT_SEARCHES_DIFFER],
    "asct_vs_ppo_short": [ASCT_SEARCHES_DIFFER],
    "asct_lm_vs_ppo": [ASCT_SEARCHES_DIFFER],
    "gats_vs_opd": [
        Premise("teacher held-out greedy minus the student's start", _lead("teacher_heldout", "sft_heldout"), at_least=TEACHER_MARGIN),
        Premise("GATS distillation weight at its first logged step", lambda r: r["arms"]["gats"]["weight_curve"][0], at_least=0.01,
                arms=("gats",)),
    ],
    "ride_vs_oprd": [Premise("teacher held-out greedy minus the base's", _lead("teacher_heldout", "base_heldout"), at_least=TEACHER_MARGIN)],
    "think_opd_worked_steps": [
        Premise("student start held-out greedy", _recorded("sft_heldout", "greedy_accuracy"), at_least=FLOOR),
        Premise("teacher held-out greedy minus the student's start", _lead("teacher_heldout", "sft_heldout"), at_least=TEACHER_MARGIN),
    ],
    # RL's own gain on two-step problems needs a start that solves some of them (GRPO from the checkpoint: 5%, no gain)
    "smollm2_sft_rl": [SFT_SOLVES_TWO_STEP],
    "smollm2_sft_rl_low_lr": [SFT_SOLVES_TWO_STEP],
    "sipo_vs_grpo": [Premise("student start held-out greedy", _recorded("sft_heldout", "greedy_accuracy"), at_least=FLOOR)],
    "rfpo_vs_ppo": [Premise("success critic's held-out AUC", _recorded("critic", "heldout_auc"), at_least=0.65, arms=("rfpo", "rfpo_raw"))],
    # chance is about 0.3 on this task (docs/viskg.md: the answer is another object's colour or shape)
    "viskg_gdpo_vs_grpo": [Premise("VLM accuracy after SFT (chance ~0.3)", lambda r: _row(r, "gdpo", "accuracy_sft"), at_least=0.45)],
    "care_dialogue": [Premise("true quality after RL, oracle weights minus uniform",
                              lambda r: _row(r, "oracle", "true_quality_after", "weights") - _row(r, "uniform", "true_quality_after", "weights"),
                              at_least=0.01)],
    "gm_dpo_flexbench": [Premise("greedy GPA of the start (ceiling 100)", _recorded("arms", "dpo", "captions_before", "greedy_gpa"), at_most=90.0)],
    "trm_anti_polarisation": [Premise("warm-up TRM's held-out pair accuracy (room to fix)", _recorded("arms", "warmup", "heldout_pair_accuracy"),
                                      at_most=0.9)],
    "respo_vs_clip": [Premise("clip baseline's held-out greedy gain", lambda r: _row(r, "clip", "heldout_greedy_after") - _row(r, "clip", "heldout_greedy_before"),
                              at_least=0.01)],
    "bridge_vs_baselines": [Premise("held-out questions evaluated", _recorded("n_heldout"), at_least=100)],
    # UniOPSD is GiGPO unless its peer teacher enters the step credit: c_k < 1 needs rho_used > 0 and a taught row
    "pr_opd_text_world": [Premise("UniOPSD's share of step-rows whose credit the peer teacher entered (c_k < 1), run mean",
                                  _recorded("arms", "uniopsd", "arbitration", "arbitrated_share"), at_least=0.05, arms=("uniopsd",))],
    # the graded reward can only teach something Hit@1 does not where it scores samples differently, from a start with room
    "kgpo_vs_hit1": [Premise("share of the start's sampled lists whose graded reward differs from Hit@1", _recorded("start_signal", "share_graded_differs"),
                             at_least=0.05),
                     Premise("start held-out Hit@1 (greedy)", _recorded("sft_heldout", "greedy_accuracy"), at_least=FLOOR, at_most=1 - FLOOR)],
    # the verifier must accept wrong answers the start policy actually samples, and the start must have correctness to lose
    "audit_selective_control": [Premise("accepted-error rate of the start's samples on training prompts", _recorded("start", "train", "accepted_error"),
                                        at_least=0.01),
                                Premise("start's sampled correctness on training prompts", _recorded("start", "train", "correct"),
                                        at_least=FLOOR, at_most=1 - FLOOR)],
    # ABC-Align's case: pseudo labels biased enough to need a correction, and a plug-in alpha away from PPI's 1 (else the
    # abc_align and ppi arms are the same objective)
    "abc_align_pseudo_labels": [
        Premise("pseudo labels' error rate", _recorded("pseudo_error_rate"), at_least=0.05),
        Premise("ABC-Align's mean alpha over training", lambda r: sum(r["arms"]["abc_align"]["alpha_curve"]) / len(r["arms"]["abc_align"]["alpha_curve"]),
                at_most=0.9, arms=("ppi",)),
    ],
    # editing needs a base that knows its facts (locality and retention read them); the same-exposure control must
    # have learned the paraphrase prompts it was given, or it is not the control it stands for
    "glime_vs_naive": [
        Premise("base model's accuracy on the unedited facts", lambda r: _row(r, "base (before edits)", "unedited_accuracy"), at_least=0.9),
        # (rounded: accuracies over 40 probes, so 0.45 - 0.40 is the 0.05 it reads as, not 0.0499...)
        Premise("naive_paraphrase's accuracy on its trained paraphrases minus naive's",
                lambda r: round(_row(r, "naive_paraphrase", "paraphrase_accuracy") - _row(r, "naive", "paraphrase_accuracy"), 6), at_least=0.05,
                arms=("naive_paraphrase",)),
    ],
    # the real checkpoint's samplers: answers long enough to search over, contexts that move the model (TTSD's reward is
    # their log-odds), chains that move (0.92-0.99 MH acceptance on the tiny models)
    "smollm2_samplers": [
        Premise("greedy answer length (generated tokens per answer)", lambda r: r["arms"]["greedy"]["generated_tokens"], at_least=16),
        Premise("greedy accuracy under c+ minus under c-",
                lambda r: r["arms"]["context_positive"]["accuracy"] - r["arms"]["context_negative"]["accuracy"], at_least=0.05, arms=("ttsd",)),
        Premise("power sampling's MH acceptance", lambda r: r["arms"]["power"]["mh_acceptance"], at_most=0.9,
                arms=("power", "power_matched", "ppt")),
    ],
    # a pick over N samples can only beat one sample where some problems have right and wrong samples among their N
    "smollm2_ttsd_reward": [Premise("room to pick: pass@N minus one sample's accuracy",
                                    lambda r: r["arms"]["oracle"]["accuracy"] - r["arms"]["temperature"]["accuracy"], at_least=0.1)],
    # an objective that samples exactly what the example sampled at every step is the same run under another name
    "smollm2_objectives": [Premise(f"{arm}'s completion-length curve minus the example's (mean |difference|, tokens)",
                                   _recorded("completion_length_gap", arm), at_least=0.25, arms=(arm,))
                           for arm in ("grpo", "dr_grpo", "dapo", "gspo", "max_rl", "remax", "qglas")],
    # the self-teacher must read the hint (the checkpoint told the answer vs not, one measurement for every seed), SIPO's
    # redistribution must act in all-fail groups, and each arm's run must differ from the example's
    "smollm2_sipo": [
        SELF_TEACHER_READS_THE_HINT,
        Premise("SIPO advantage's token std in all-fail groups", lambda r: _row(r, "sipo", "all_fail_token_spread"), at_least=1e-4),
        Premise("sipo's completion-length curve minus the example's (mean |difference|, tokens)", _recorded("completion_length_gap", "sipo"), at_least=0.25),
    ],
    "smollm2_opsd": [
        SELF_TEACHER_READS_THE_HINT,
        Premise("opsd's completion-length curve minus the example's (mean |difference|, tokens)", _recorded("completion_length_gap", "opsd"), at_least=0.25),
    ],
    # ROFT learns from its retrospections only: they must be a different (better) answer than the attempts they explain,
    # else the loss is self-imitation of the attempts; and a start off floor and ceiling for either arm to move
    "roft_vs_grpo": [
        Premise("ROFT's retrospections' accuracy minus its attempts' (first fifth of updates)", _recorded("arms", "roft", "retrospections", "lead_first"),
                at_least=TEACHER_MARGIN, arms=("roft",)),
        Premise("start's held-out greedy (floor and ceiling)", _recorded("sft_heldout", "greedy_accuracy"), at_least=FLOOR, at_most=0.95),
    ],
    "flow_gdpo_vs_sum": FLOW,
    "flow_gdpo_vs_sum_one_sft": FLOW,
}


def check(claim: str, per_seed: list[dict]) -> list[list[tuple[Premise, dict]]]:
    """Per seed, each declared premise of `claim` with its measured check."""
    return [[(p, p.check(result)) for p in PREMISES.get(claim, [])] for result in per_seed]


def held_seeds(checks: list[list[tuple[Premise, dict]]], seeds: list[int], better: str, worse: str) -> tuple[list[int], list[str]]:
    """Positions of the seeds where every premise concerning `better` vs `worse` held, and a line per failure."""
    held, failures = [], []
    for i, (seed, seed_checks) in enumerate(zip(seeds, checks)):
        failed = [c for p, c in seed_checks if p.concerns(better, worse) and not c["held"]]
        if failed:
            failures += [f"seed {seed}: {c['premise']}: " + ("not recorded" if c["value"] is None else f"{c['value']:.4g}") for c in failed]
        else:
            held.append(i)
    return held, failures
