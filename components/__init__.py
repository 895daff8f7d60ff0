"""Kubeflow container components, one per registered stage, all running the one posttrain image."""
