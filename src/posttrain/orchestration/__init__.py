"""What the launchers (DVC, Airflow, Kubeflow) share: the pipeline graph, the parameter schema, preflight,
finalisation and comparison. Nothing here imports torch; the DAG files read only the JSON this package writes.
"""
