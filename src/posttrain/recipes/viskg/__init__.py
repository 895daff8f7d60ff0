"""VisKG (specs §29; docs/viskg.md): the synthetic VQA scenes (`data`), the vision-language model (`vlm`), the rewards
accuracy, format and compactness (`rewards`), the SFT and GDPO loops (`trainer`), the stages `viskg_sft` and `viskg_rl`
(`stages`) and the settings section `viskg` (`settings`). Pipeline: recipes/viskg/dvc.yaml.
Loaded as the plugin entry point `viskg` (pyproject.toml): importing it registers the stages and the section.
"""

from posttrain.recipes.viskg import rewards, settings, stages  # noqa: F401  (registers the rewards, the section and the stages)
