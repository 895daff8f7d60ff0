"""Recipes: one folder per method family that is more than registered parts (its stages, settings section,
trainer, environment and networks; its pipeline files in the repository's `recipes/<name>/`).

A recipe is a plugin like any installed package's: pyproject.toml names it in the entry-point group
`posttrain.plugins`, and loading it registers its stages (`posttrain.stages.stages`), its settings section
(`posttrain.stages.sections`) and its parts. Nothing in the core imports a recipe, and no recipe imports
another (tests/unit/test_import_rules.py).
"""
