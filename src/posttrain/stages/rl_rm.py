"""Stage `rl_rm`: the `rl` stage rewarded by the trained reward model (RLHF's last step).

Inputs: `data`, `policy` (the SFT model) and `reward_model` (the reward_model stage's output). The rl settings
apply with two changes: the rewards are `reward_model.rl_rewards`, and the reward named `reward_model.kind`
reads its model from the `reward_model` input. Outputs and resume behaviour are the rl stage's.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.config import Config
from posttrain.stages import rl, stages


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
    return rl.run(cfg.model_copy(update={"rl": rl_cfg}), {"data": inputs["data"], "policy": inputs["policy"]}, out_dir, tracker, resume)
