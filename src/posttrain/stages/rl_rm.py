"""Stage `rl_rm`: the `rl` stage rewarded by the trained reward model (RLHF's last step).

Inputs: `data`, `policy` (the SFT model, or any checkpoint directory) and `reward_model` (the reward_model stage's
output; for `bt`, also a plain sequence-classification checkpoint with one label: a published reward model). The rl settings
apply with two changes: the rewards are `reward_model.rl_rewards`, and the reward named `reward_model.kind`
reads its model from the `reward_model` input. With `reward_model.prompts: disjoint` RL runs on the half of the
training prompts the reward model's pairs did not come from (`reward_model_prompts`, the reward_model stage's
split); the stage stops with one line when a training pair of the reward model (its `pairs_train.jsonl`) asks an RL
prompt. Outputs and resume behaviour are the rl stage's.
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.config import Config
from posttrain.data.preferences import reward_model_prompts
from posttrain.errors import UserError
from posttrain.stages import rl, stages


def rl_prompts(cfg: Config, reward_model_dir: Path, examples: list) -> list:
    """The examples RL runs on under `reward_model.prompts`, checked against the reward model's training pairs."""
    _, rl_examples = reward_model_prompts(examples, cfg.reward_model.prompts, cfg.pipeline.seed)
    pairs = reward_model_dir / "pairs_train.jsonl"
    if cfg.reward_model.prompts == "disjoint" and pairs.is_file():
        asked = {e.prompt for e in rl_examples} & {json.loads(line)["prompt"] for line in pairs.read_text().splitlines() if line.strip()}
        if asked:
            raise UserError(f"reward_model.prompts=disjoint: {len(asked)} of the RL prompts are in the reward model's training pairs "
                            f"({pairs}); train it with the same reward_model settings, or set reward_model.prompts=same")
    return rl_examples


@stages.register(
    "rl_rm",
    inputs={"data": "outputs/data", "policy": "outputs/sft", "reward_model": "outputs/reward_model"},
    requires={"data": ["train.jsonl"], "policy": ["model/config.json"], "reward_model": ["model/config.json"]},
    resumable=True,
    rl_objective=True,  # trains with the rl section's objective: its run is tagged with it (tracking.objective_tags)
)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    kind = cfg.reward_model.kind
    from posttrain.trainers.online_rl import resolve_rl

    rl_cfg = resolve_rl(cfg.rl, rewards=cfg.reward_model.rl_rewards, options={kind: {"path": str(inputs["reward_model"])}})
    return rl.train_and_save(cfg.model_copy(update={"rl": rl_cfg}), {"data": inputs["data"], "policy": inputs["policy"]}, out_dir, tracker,
                             resume, select_examples=lambda examples: rl_prompts(cfg, inputs["reward_model"], examples),
                             hash_sections=("reward_model",))
