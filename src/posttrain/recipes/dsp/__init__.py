"""DSP, Diffusion Subgoal Planning (specs §20; docs/dsp.md): a seeded maze (`maze`), reward-free exploration data,
the subgoal flow with classifier-free guidance and its baselines (`objective`, `networks`, `trainer`), the stages
`maze_data` and `dsp` (`stages`) and the settings section `dsp` (`settings`). Pipeline: recipes/dsp/dvc.yaml.
Loaded as the plugin entry point `dsp` (pyproject.toml): importing it registers the stages and the section.
"""

from posttrain.recipes.dsp import settings, stages  # noqa: F401  (registers the section and the stages)
