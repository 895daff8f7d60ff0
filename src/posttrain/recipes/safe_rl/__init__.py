"""VLM-Safe-RL (specs §16; docs/safe_rl.md): a small driving environment seen by a camera (`driving`), a tiny CLIP
trained on its frames and captions, PPO-Lagrangian with frozen-CLIP reward shaping and the augmented multiplier update
(`objective`, `policy`, `trainer`), the stages `drive_encoder` and `safe_rl` (`stages`) and the settings section
`safe_rl` (`settings`). Pipeline: recipes/safe_rl/dvc.yaml.
Loaded as the plugin entry point `safe_rl` (pyproject.toml): importing it registers the stages and the section.
"""

from posttrain.recipes.safe_rl import settings, stages  # noqa: F401  (registers the section and the stages)
