"""Every on-policy distillation method takes 2 RL steps in-process on a micro model with frozen teacher and
base models (perturbed copies of the student), plus one CLI run of the `distill` stage."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from helpers import REPO, copy_outputs, micro_params, posttrain
from posttrain import resolve
from posttrain.models.teacher import freeze
from posttrain.objectives.distill.presets import DISTILL_METHODS
from posttrain.trainers.online_rl import OnlineRL, PromptStream, RLRun

# options that make a 2-step run exercise the method's whole path (e.g. no warm start, no measured S_T)
FAST = {
    "pr_opd": ["rl.options.pr_opd.warm_start=0"], "gats": ["rl.options.gats.teacher_success=0.5"],
    # a random micro model solves nothing: a length reward makes the group rewards differ so uniopsd has a signal
    "uniopsd": ["rl.rewards=[{name: correctness}, {name: overlong}]"],
}


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.tasks import build_task

    root = tmp_path_factory.mktemp("distill")
    cfg = resolve.load(micro_params(root), ["rl.max_new_tokens=4", "rl.prompts_per_step=3", "rl.group_size=3"])
    task = build_task(cfg.task)
    tokenizer = train_char_tokenizer([task.alphabet()])
    torch.manual_seed(0)
    model = build_tiny(cfg.model, tokenizer)
    teachers = {}
    for role, seed in (("teacher", 1), ("base", 2)):
        other = copy.deepcopy(model)
        with torch.no_grad():
            generator = torch.Generator().manual_seed(seed)
            for p in other.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=generator))
        teachers[role] = freeze(other)
    return root, task, task.splits(0)["train"][:30], tokenizer, {k: v.clone() for k, v in model.state_dict().items()}, model, teachers


def two_steps(micro, method: str, extra: list[str] = ()):
    root, task, examples, tokenizer, state, model, teachers = micro
    model.load_state_dict(state)
    cfg = resolve.load(root / "params.yaml", ["rl.max_new_tokens=4", "rl.prompts_per_step=3", "rl.group_size=3", f"rl.preset={method}", *FAST.get(method, []), *extra])
    run = RLRun(model, tokenizer, task, examples, cfg.rl, seed=0, checkpoint_dir=REPO / "unused", config_hash="x", models=teachers)
    trainer, stream = OnlineRL(run, total_steps=2), PromptStream(examples, 0)
    before = [p.detach().clone() for p in model.parameters()]
    history = [trainer.step(stream.take(3)).metrics for _ in range(2)]
    moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(not p.requires_grad for t in teachers.values() for p in t.parameters())
    return history, moved, trainer


@pytest.mark.parametrize("method", DISTILL_METHODS)
def test_every_distillation_method_takes_two_steps(micro, method):
    history, moved, trainer = two_steps(micro, method)
    assert len(history) == 2 and trainer.step_index == 2
    for metrics in history:
        assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert moved, f"{method} did not change the policy"


def test_ride_output_space_baseline_runs(micro):
    history, moved, _ = two_steps(micro, "ride", ["rl.aux=[ride_logits]"])
    assert moved and all(math.isfinite(m["ride/distance"]) for m in history)


def test_distill_stage_through_the_cli(pipeline_outputs, tmp_path):
    copy_outputs(pipeline_outputs, tmp_path)
    micro_params(tmp_path, distill={"method": "gats", "steps": 3, "prompts_per_step": 3})  # checkpoints at step 2 (micro rl)
    posttrain("distill", "--out", "outputs/distill", cwd=tmp_path)
    history = json.loads((tmp_path / "outputs" / "distill" / "history.json").read_text())
    assert len(history) == 3 and (tmp_path / "outputs" / "distill" / "model" / "config.json").is_file()
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["posttrain"], filter_string="tags.stage = 'distill'")
    assert list(runs["tags.objective"]) == ["gats+clip"] and list(runs["tags.distill_method"]) == ["gats"]


def test_opd_without_a_teacher_is_a_user_error(micro):
    from posttrain.errors import UserError

    root, task, examples, tokenizer, state, model, teachers = micro
    cfg = resolve.load(root / "params.yaml", ["rl.max_new_tokens=4", "rl.group_size=3", "rl.preset=opd"])
    run = RLRun(model, tokenizer, task, examples, cfg.rl, seed=0, checkpoint_dir=REPO / "unused", config_hash="x")
    with pytest.raises(UserError, match="teacher"):  # before any rollout; the CLI turns it into one line and exit code 2
        OnlineRL(run)


@pytest.mark.parametrize("method", ["grpo", "pr_opd"])
def test_text_world_multi_turn_training_takes_two_steps(tmp_path, method):
    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.tasks import build_task

    overrides = ["task.name=text_world", "task.n_train=60", "task.n_heldout=20", "rl.max_new_tokens=9", "rl.group_size=3",
                 f"rl.preset={method}", "rl.options.pr_opd.warm_start=1"]
    cfg = resolve.load(micro_params(tmp_path), overrides)
    task = build_task(cfg.task)
    tokenizer = train_char_tokenizer([task.alphabet()])
    torch.manual_seed(0)
    model = build_tiny(cfg.model, tokenizer)
    examples = task.splits(0)["train"]
    run = RLRun(model, tokenizer, task, examples, cfg.rl, seed=0, checkpoint_dir=REPO / "unused", config_hash="x")
    trainer, stream = OnlineRL(run, total_steps=2), PromptStream(examples, 0)
    for _step in (1, 2):
        result = trainer.step(stream.take(3))
        assert all(math.isfinite(v) for v in result.metrics.values())
        assert (result.batch.completion_mask == 0).any()  # observations were appended and masked
    if method == "pr_opd":  # warm start (step 1) then the representation term (step 2)
        assert result.metrics["pr_opd/rep_loss"] > 0 and "pr_opd" in trainer.modules
        assert any(p.grad is None and not torch.equal(p, torch.eye(p.shape[0])) for p in trainer.modules["pr_opd"].parameters() if p.dim() == 2)


def test_uniopsd_on_the_text_world_gives_step_credit_at_anchors_unlike_the_episode_credit(tmp_path):
    """One UniOPSD update on real text-world episodes: the rollouts share anchor states beyond the prompt, the
    step tier is non-zero and differs from the episode tier, the peer teacher scores taught rows, and a group's
    lone success is untaught. The tiny policy is biased towards the world's actions (l, r, s) so episodes walk
    and some succeed."""
    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.objectives.distill.uniopsd import tiers
    from posttrain.tasks import build_task
    from posttrain.trainers.extras import success

    overrides = ["task.name=text_world", "task.n_train=60", "task.n_heldout=20", "rl.max_new_tokens=10", "rl.group_size=6",
                 "rl.preset=uniopsd", "rl.rewards=[{name: correctness}]"]
    cfg = resolve.load(micro_params(tmp_path), overrides)
    task = build_task(cfg.task)
    tokenizer = train_char_tokenizer([task.alphabet()])
    torch.manual_seed(0)
    model = build_tiny(cfg.model, tokenizer)
    bias = torch.zeros(model.lm_head.out_features)
    bias[tokenizer.convert_tokens_to_ids(list("lrs"))] = 6.0
    # a bias of the output layer, not a forward hook: the engine's decoder calls the model's layers, not its forward
    model.lm_head.bias = torch.nn.Parameter(bias)
    examples = task.splits(0)["train"]
    run = RLRun(model, tokenizer, task, examples, cfg.rl, seed=0, checkpoint_dir=REPO / "unused", config_hash="x")
    trainer, stream = OnlineRL(run, total_steps=1), PromptStream(examples, 0)
    batch = trainer.step(stream.take(8)).batch
    opts = cfg.rl.options_for("uniopsd")
    steps, tier = tiers(batch, batch.extras["peer_logp_gap"], cfg.rl, opts)
    first = torch.zeros_like(steps.row, dtype=torch.bool)
    first[torch.unique_consecutive(steps.row, return_counts=True)[1].cumsum(0)[:-1]] = True
    first[0] = True
    later = steps.anchor[~first]
    assert later.unique(return_counts=True)[1].max() >= 2, "no two rollouts met at a state beyond the prompt"
    assert tier.a_step.abs().sum() > 0 and not torch.allclose(tier.a_step, tier.a_episode, atol=1e-4)
    ok = success(batch)
    assert 0 < int(ok.sum()) < batch.size
    taught = (batch.extras["peer_logp_gap"] != 0).any(-1)
    assert taught.any(), "no rollout had a successful peer"
    for g in batch.group.unique():
        rows = (batch.group == g).nonzero().squeeze(-1)
        if int(ok[rows].sum()) == 1:  # the lone success is not its own teacher; its failed peers are taught by it
            assert not taught[rows[ok[rows]]].any()
