"""The image recipe's stages: city -> curate -> flow_sft -> flow_rl -> flow_eval (recipes/image/dvc.yaml)."""

from posttrain.recipes.image.stages import city, curate, flow_eval, flow_rl, flow_sft  # noqa: F401  (registers)
