"""Stage `distill`: on-policy distillation from a frozen teacher (the pipeline's RL model by default).

The method (`distill.method`, one of the distillation presets) is applied on top of the `rl` section, with
`distill.steps` and `distill.prompts_per_step`; its settings are the usual `rl.options.<name>`. Inputs:
`data`, `policy` (the student's starting point, default the SFT model), `teacher` (default the RL model)
and `base` (the teacher's pre-RL base, for RIDE; default the SFT model). Only the teacher models the method
needs are loaded, frozen. Outputs as the `rl` stage: `model/`, `history.json`, `reward_curve.png`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from posttrain.config import Config, RLConfig, one_line
from posttrain.errors import UserError
from posttrain.stages import model_dir, stages
from posttrain.stages.rl import train_and_save


def distill_rl_config(cfg: Config) -> RLConfig:
    """The rl section with the method's preset keys and the distill budget, validated and resolved again."""
    from posttrain.objectives.presets import expand
    from posttrain.trainers.online_rl import resolve_rl  # torch: after the cheap checks

    raw = cfg.rl.model_dump(mode="json")
    raw.update(expand(cfg.distill.method, raw), steps=cfg.distill.steps, prompts_per_step=cfg.distill.prompts_per_step, preset=None)
    try:
        rl = RLConfig.model_validate(raw)
    except ValidationError as e:
        raise UserError(one_line(e, RLConfig, prefix="rl.")) from None
    return resolve_rl(rl)


@stages.register(
    "distill",
    inputs={"data": "outputs/data", "policy": "outputs/sft", "teacher": "outputs/rl", "base": "outputs/sft"},
    requires={"data": ["train.jsonl"], "policy": ["model/config.json"], "teacher": ["model/config.json"], "base": ["model/config.json"]},
    resumable=True,
    rl_objective=True,  # trains with the rl section's objective: its run is tagged with it (tracking.objective_tags)
)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    from posttrain.models.teacher import load_teacher
    from posttrain.trainers.extras import roles_needed

    rl = distill_rl_config(cfg)
    roles = roles_needed(rl) & set(inputs)  # teacher / base: exactly the roles the method's extras read

    def load_models(tokenizer, device):
        return {role: load_teacher(model_dir(inputs[role]), tokenizer, cfg.model.dtype, device) for role in sorted(roles)}

    # the stage's run was opened with the rl section's objective tag
    tracker.set_tags(objective="+".join([rl.advantage, rl.loss, *rl.aux]), distill_method=cfg.distill.method)
    return train_and_save(cfg.model_copy(update={"rl": rl}), inputs, out_dir, tracker, resume, load_models)
