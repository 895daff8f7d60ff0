"""`posttrain submit`: validate the run settings locally, then start the compiled pipeline through kfp.Client.

The run parameters are the config sections (what the compiled pipeline declares); they are validated with
the same pydantic models as every other entry point before anything reaches the cluster.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from posttrain import resolve
from posttrain.errors import UserError
from posttrain.orchestration.preflight import without_nulls


def run_arguments(params: Path, overrides: list[str], package: Path, image: str) -> dict:
    cfg = resolve.load(params, overrides)
    if not package.is_file():
        raise UserError(f"compiled pipeline not found: {package} (run `make pipelines`)")
    declared = next(yaml.safe_load_all(package.read_text()))["root"]["inputDefinitions"]["parameters"]
    sections = cfg.model_dump(mode="json")
    arguments = {name: without_nulls(sections[name]) for name in declared if name in sections}
    arguments["image"] = image or cfg.orchestration.image
    if "objectives" in declared:  # the sweep's arms (pipelines/build.py), from orchestration.sweep
        arguments["objectives"] = list(cfg.orchestration.sweep.objectives)
    missing = set(declared) - set(arguments)
    if missing:
        raise UserError(f"{package} declares parameters this config has no value for: {sorted(missing)} (run `make pipelines`)")
    return arguments


def submit_run(host: str, params: Path, overrides: list[str], package: Path, experiment: str, image: str, run_name: str) -> str:
    arguments = run_arguments(params, overrides, package, image)
    import warnings

    import kfp

    warnings.filterwarnings("ignore", message="This client only works with", category=FutureWarning)  # we target KFP 2.x

    name = experiment or arguments["pipeline"]["name"]
    try:
        client = kfp.Client(host=host)
        result = client.create_run_from_pipeline_package(str(package), arguments=arguments, run_name=run_name or None, experiment_name=name)
    except Exception as e:  # connection refused, HTTP errors from the API: one line, not a traceback
        raise UserError(f"Kubeflow Pipelines at {host} refused the run: {str(e).splitlines()[0][:300]}") from None
    return f"submitted run {result.run_id} to {host} (experiment {name!r})"
