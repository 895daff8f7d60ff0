"""Stage `reward_model`: train the reward model named by `reward_model.kind` on preference pairs.

Inputs: `data` (train.jsonl, heldout.jsonl) and `policy` (the SFT model the reward model starts from).
Pairs come from `reward_model.data` (training prompts; held-out pairs from held-out prompts) or from the
file `reward_model.pairs`. With `reward_model.prompts: disjoint` (the default) the training prompts are halved by
prompt (`reward_model_prompts`, drawn with pipeline.seed): the pairs come from one half and `rl_rm` runs RL on the
other, so the reward model never learnt the answers of the prompts RL asks; `same`: every training prompt for both. Outputs: `model/` (what `rl.options.<kind>.path` points the RL reward at),
`pairs_train.jsonl`, `pairs_heldout.jsonl`; metrics: `pair_prompts_in_rl` (how many of the training pairs' prompts are rl_rm's RL prompts: 0 when disjoint),
held-out pair accuracy before and after training (`trm`:
after its format warm-up and after pairwise RL, with ties, score spread and parse rate) and `nonfinite_steps`. With
`--resume` a stopped run continues from its last checkpoint (`reward_model.checkpoint_every`; `trm`: in the warm-up
and in pairwise RL).
"""

from __future__ import annotations

from pathlib import Path

from posttrain.config import Config
from posttrain.data import read_examples
from posttrain.data.preferences import preference_data, reward_model_prompts, write_pairs
from posttrain.stages import model_dir, stages
from posttrain.stages.preference import load_pairs
from posttrain.tasks import build_task
import posttrain.trainers.reward_model  # noqa: E402,F401  (registers the `bt` trainer in rewards.reward_models)
import posttrain.trainers.trm  # noqa: E402,F401  (registers the `trm` trainer)


@stages.register(
    "reward_model",
    inputs={"data": "outputs/data", "policy": "outputs/sft"},
    requires={"data": ["train.jsonl", "heldout.jsonl"], "policy": ["model/config.json"]},
    resumable=True,
)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    from posttrain.models import load_pretrained, select_device
    from posttrain.rewards import reward_models
    from posttrain.runtime import seed_everything
    from posttrain.trainers.loop import TrainLoop

    task = build_task(cfg.task)
    train_examples, heldout_examples = read_examples(inputs["data"] / "train.jsonl"), read_examples(inputs["data"] / "heldout.jsonl")
    seed_everything(cfg.pipeline.seed)
    policy = None
    if preference_data.entry(cfg.reward_model.data).meta.get("needs_policy") and cfg.reward_model.pairs is None:
        model, tokenizer = load_pretrained(model_dir(inputs["policy"]), cfg.model.dtype)
        policy = (model.to(select_device(cfg.pipeline.device)), tokenizer)
    rm_examples, rl_examples = reward_model_prompts(train_examples, cfg.reward_model.prompts, cfg.pipeline.seed)
    train, heldout = load_pairs(cfg, cfg.reward_model, task, rm_examples, heldout_examples, policy)
    train_fn = reward_models.get(cfg.reward_model.kind)
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "task", "model", "rl", "reward_model"),
                               cfg.reward_model.checkpoint_every, resume, "reward_model")
    metrics = train_fn(cfg, model_dir(inputs["policy"]), train, heldout, out_dir, cfg.pipeline.seed,
                       on_log=lambda step, m: tracker.log_metrics(m, step), loop=loop)
    write_pairs(out_dir / "pairs_train.jsonl", train)
    write_pairs(out_dir / "pairs_heldout.jsonl", heldout)
    tracker.log_artifacts(out_dir / "model", "model")
    rl_prompts = {e.prompt for e in rl_examples}
    metrics.update(n_pairs=float(len(train)), n_heldout_pairs=float(len(heldout)),
                   pair_prompts_in_rl=float(len({p.prompt for p in train} & rl_prompts)))
    tracker.log_metrics(metrics)
    return metrics
