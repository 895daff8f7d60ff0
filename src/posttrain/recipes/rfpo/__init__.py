"""RFPO, Reward-Free Policy Optimization (specs §14; docs/objectives.md): the success critic's pretraining on the SFT
policy's verifier-labelled rollouts (`trainer`), the stage `critic` (`stages`) and its settings section `critic`
(`settings`), the reward `rfpo` (`reward`: binarised, length-debiased score of the frozen critic) and the preset
`rfpo` (`preset`: that reward with the frozen critic as the GAE baseline, for the core `rl` stage). The critic itself
is the core value model (models/value.py, `rl.critic`). Pipeline: recipes/rfpo/dvc.yaml.
Loaded as the plugin entry point `rfpo` (pyproject.toml): importing it registers the stage, the section, the reward
and the preset.
"""

from posttrain.recipes.rfpo import preset, reward, settings, stages  # noqa: F401  (registers the preset, the reward, the section and the stage)
