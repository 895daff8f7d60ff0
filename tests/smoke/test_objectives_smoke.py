"""Every registered advantage estimator x policy loss takes 2 RL steps in-process on a micro model (the CLI
costs ~8 s a call, so the matrix runs through `OnlineRL.step`), plus one CLI run of the DAPO preset."""

from __future__ import annotations

import copy
import itertools
import json
import math

import pytest
import torch

from helpers import REPO, copy_outputs, micro_params, posttrain
from posttrain import resolve
from posttrain.objectives import advantages, aggregations, losses, needs_of
from posttrain.trainers.online_rl import OnlineRL, PromptStream, RLRun

# (estimator, loss) pairs that are invalid by definition, with the reason; none so far: every estimator
# returns a [B] advantage and every loss accepts one.
INVALID: dict[tuple[str, str], str] = {}
COMBOS = [
    pytest.param(a, l, id=f"{a}+{l}" + (f"-SKIP({INVALID[a, l]})" if (a, l) in INVALID else ""),
                 marks=[pytest.mark.skip(reason=INVALID[a, l])] if (a, l) in INVALID else [])
    for a, l in itertools.product(advantages.names(), losses.names())
]
# a method made for one kind of task (registry meta `tasks`, e.g. witness) runs on the first task it names
TASK_SETTINGS = {
    "arithmetic": [],
    "distribution": ["task.name=distribution", "task.n_train=40", "task.n_heldout=10"],
    "diagnosis": ["task.name=diagnosis", "task.n_train=40", "task.n_heldout=10", "rl.rewards=[{name: kgpo}]", "rl.max_new_tokens=12"],
    # few instances and a longer SFT: the micro policy writes well-formed "<strategy>:<solution>" answers and some of
    # them are optimal, so a group can hold correct rollouts of different strategies (what the sdrl bonus pays)
    "optimisation": ["task.name=optimisation", "task.n_train=24", "task.n_heldout=10", "rl.max_new_tokens=8", "sft.steps=100", "sft.lr=0.01"],
}


def task_for(advantage: str) -> str:
    return advantages.entry(advantage).meta.get("tasks", ("arithmetic",))[0]


def build_micro(root, task_name: str):
    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.tasks import build_task
    from posttrain.trainers.sft import train_sft

    overrides = ["rl.max_new_tokens=4", "rl.prompts_per_step=3", "rl.group_size=3", *TASK_SETTINGS[task_name]]  # later wins
    cfg = resolve.load(micro_params(root), overrides)
    task = build_task(cfg.task)
    tokenizer = train_char_tokenizer([task.alphabet()])
    torch.manual_seed(0)
    model = build_tiny(cfg.model, tokenizer)
    # a few SFT steps so that rollouts differ in reward within a group (a random model scores 0 everywhere, and
    # then no estimator has anything to move the weights with)
    train_sft(model, tokenizer, task.splits(0)["train"], cfg.sft, 0, on_log=lambda s, m: None)
    return cfg, task, task.splits(0)["train"][:50], tokenizer, {k: v.clone() for k, v in model.state_dict().items()}, model


@pytest.fixture(scope="module")
def micros(tmp_path_factory):
    built: dict[str, tuple] = {}

    def get(task_name: str):
        if task_name not in built:
            built[task_name] = build_micro(tmp_path_factory.mktemp(task_name), task_name)
        return built[task_name]

    return get


@pytest.fixture(scope="module")
def micro(micros):
    return micros("arithmetic")


def teacher_for(model):
    """A frozen teacher that is not the start: the start with every weight perturbed, so that the distillation
    term (teacher log-probs minus the policy's) is not identically 0."""
    teacher = copy.deepcopy(model).eval().requires_grad_(False)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p.device, p.dtype) * 0.5 * p.std().clamp(min=0.02))
    return teacher


def two_steps(micro, **rl_updates):
    return train_two_steps(micro, **rl_updates)[0]


def train_two_steps(micro, **rl_updates):
    """(history, whether any weight moved, max |teacher_logp - old_logp| over produced tokens, or None)."""
    cfg, task, examples, tokenizer, state, model = micro
    model.load_state_dict(state)
    rl = resolve.updated(cfg.rl, "rl", **rl_updates)
    teachers = {"teacher": teacher_for(model)} if "teacher_logp" in needs_of(rl) else {}
    run = RLRun(model, tokenizer, task, examples, rl, seed=0, checkpoint_dir=REPO / "unused", config_hash="x", models=teachers)
    trainer, stream = OnlineRL(run, total_steps=2), PromptStream(examples, 0)  # also on a GPU (tests/gpu reuses this)
    history, teacher_gap = [], None
    for _ in range(2):
        prompts = stream.take(rl.prompts_per_step)
        result = trainer.step(prompts, more_prompts=stream.take)
        batch, texts, metrics = result.batch, result.texts, result.metrics
        assert len(texts) == batch.size == len(result.prompts) * rl.group_size
        if "teacher_logp" in batch.extras:
            gap = (batch.extras["teacher_logp"] - batch.old_logp).abs() * batch.completion_mask
            teacher_gap = max(teacher_gap or 0.0, float(gap.max()))
        history.append(metrics)
    moved = any(not torch.equal(v, state[k].to(v.device)) for k, v in model.state_dict().items())
    return history, moved, teacher_gap


@pytest.mark.parametrize("advantage,loss", COMBOS)
def test_every_estimator_and_loss_takes_two_steps(micros, advantage, loss):
    history, moved, teacher_gap = train_two_steps(micros(task_for(advantage)), advantage=advantage, loss=loss)
    for metrics in history:
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert {"loss", "grad_norm", "reward/correctness_collapsed", "reward/format_adv_share"} <= set(metrics)
        if loss == "none":  # nothing reads the policy: the trainer runs no policy forward and the step changes nothing
            assert "entropy" not in metrics and metrics["loss"] == 0.0 and metrics["grad_norm"] == 0.0
        else:
            assert {"clip_fraction", "entropy"} <= set(metrics)
    if teacher_gap is not None:  # the teacher is not the start: the distillation signal is not identically 0
        assert teacher_gap > 1e-3
    assert moved == (loss != "none"), "a policy loss must move the weights in two steps; `none` must not"
    if loss != "none":
        assert max(m["grad_norm"] for m in history) > 0


@pytest.mark.parametrize("loss,agg", [(l, a) for l in losses.names() if l != "none" for a in aggregations.names()])
def test_every_loss_under_every_aggregation_takes_two_steps(micro, loss, agg):
    """The estimator x loss matrix runs at the default aggregation; this completes it over the aggregations."""
    history, moved, _ = train_two_steps(micro, loss=loss, loss_agg=agg)
    for metrics in history:
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert "clip_fraction" in metrics
    assert moved


@pytest.mark.parametrize("correction", ["rejection", "icepop", "sampler_is", "opsm", "m2po"])
def test_new_corrections_log_the_mismatch_figures_in_sync_mode(micro, correction):
    history = two_steps(micro, correction=correction)
    for metrics in history:
        assert {"mismatch/k3", "mismatch/max_ratio", "mismatch/min_ratio", "mismatch/masked_share"} <= set(metrics), metrics
        assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("agg", ["token_sum_norm", "seq_mean"])
def test_aggregations_and_dynamic_sampling_run(micro, agg):
    history = two_steps(micro, loss_agg=agg, dynamic_sampling=True, dynamic_sampling_max_rollouts=2)
    assert all("dynamic_sampling/dropped_groups" in m and m["dynamic_sampling/extra_rollouts"] <= 2 for m in history)


def test_dapo_preset_through_the_cli(pipeline_outputs, tmp_path):
    copy_outputs(pipeline_outputs, tmp_path)
    micro_params(tmp_path, rl={"steps": 2, "checkpoint_every": 0, "prompts_per_step": 4, "group_size": 4})
    posttrain("rl", "--set", "rl.preset=dapo", "--set", "rl.dynamic_sampling_max_rollouts=1", cwd=tmp_path)
    history = json.loads((tmp_path / "outputs" / "rl" / "history.json").read_text())
    assert len(history) == 2
    assert all("reward/overlong_mean" in m and "dynamic_sampling/dropped_groups" in m for m in history)
    assert all(m["dynamic_sampling/extra_rollouts"] <= 1 for m in history)


def test_rewards_with_options_score_real_rollouts(micro):
    from posttrain.config import RewardSpec

    specs = (RewardSpec(name="correctness"), RewardSpec(name="audit_correction", weight=0.5))
    history = two_steps(micro, rewards=specs)
    for metrics in history:
        assert {"reward/audit_correction_mean", "reward/audit_correction_adv_share"} <= set(metrics)
        assert all(math.isfinite(v) for v in metrics.values())


def test_sdrl_pays_a_diversity_bonus_on_optimisation_rollouts(micros):
    """On the task sdrl is for (tasks/optimisation.py) the policy's own correct rollouts of one instance name
    different strategies, so sdrl pays more than the verifier (on arithmetic the bonus is identically 0), never
    less, and at most c (1 + beta_b + beta_w)."""
    from posttrain.config import RewardSpec

    micro = micros("optimisation")
    cfg = micro[0]
    block = {**cfg.rl.options_for("sdrl").model_dump(), "strategies": {"exact": ["^d:"], "greedy": ["^g:"], "search": ["^r:"]}}
    opts = cfg.rl.options_for("sdrl")
    specs = (RewardSpec(name="sdrl"), RewardSpec(name="correctness", weight=0.0))
    history = two_steps(micro, rewards=specs, options={"sdrl": block}, group_size=8, prompts_per_step=8)
    for metrics in history:
        sdrl, correct = metrics["reward/sdrl_mean"], metrics["reward/correctness_mean"]
        assert correct > 0 and correct - 1e-6 <= sdrl <= correct * (1 + opts.beta_b + opts.beta_w) + 1e-6, metrics
    assert max(m["reward/sdrl_mean"] - m["reward/correctness_mean"] for m in history) > 1e-3, "the diversity bonus was 0"


def test_kgpo_reward_trains_on_the_diagnosis_task(micros):
    from posttrain.config import RewardSpec

    history = two_steps(micros("diagnosis"), rewards=(RewardSpec(name="kgpo"), RewardSpec(name="correctness", weight=0.5)))
    for metrics in history:
        assert {"reward/kgpo_mean", "reward/kgpo_adv_share", "reward/correctness_mean"} <= set(metrics)
        assert all(math.isfinite(v) for v in metrics.values())
