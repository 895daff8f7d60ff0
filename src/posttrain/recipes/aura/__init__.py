"""AURA (spec §12; docs/aura.md): the chronological market sandbox with its tools, episodes and direction-magnitude
score (`market`), the sandbox as the task `market` with its options model, task.options.market (`task`), and the
rewards `aura`, `aura_direction` and `aura_magnitude` (`reward`). It runs on the core stages data, sft, rl (rl.preset
ppo) and eval. Pipeline: recipes/aura/dvc.yaml.
Loaded as the plugin entry point `aura` (pyproject.toml): importing it registers the task and the rewards.
"""

from posttrain.recipes.aura import reward, task  # noqa: F401  (registers the task and the rewards)
