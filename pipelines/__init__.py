"""Kubeflow pipelines built from the task graph (dvc.yaml) and the stage registry; `python -m pipelines` compiles them."""
