"""MotionInsight (specs §30; docs/motion.md): a motion-fidelity evaluator. Synthetic annotated clips of shapes falling
under gravity with injected failure causes (`videos`), a video encoder over motion maps or RGB frames into a tiny
Llama decoder (`evaluator`), SFT then GRPO with the spec's reward (`reward`, `trainer`), the stages `motion_data`,
`motion_sft` and `motion_grpo` (`stages`) and the settings section `motion` (`settings`). Pipeline: recipes/motion/dvc.yaml.
Loaded as the plugin entry point `motion` (pyproject.toml): importing it registers the stages and the section.
"""

from posttrain.recipes.motion import reward, settings, stages  # noqa: F401  (registers the rewards, the section and the stages)
