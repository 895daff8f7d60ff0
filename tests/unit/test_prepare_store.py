"""The launchers' preflight creates the MLflow store and the pipeline's experiment before the stages start: stages
that start together (rlhf's knowledge, care and data) on a new SQLite store raced on creating its tables."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from helpers import REPO, posttrain_main


def test_preflight_creates_the_store_and_the_experiment_once(monkeypatch, capsys, tmp_path):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    store = tmp_path / "mlflow.db"
    code, out, err = posttrain_main(monkeypatch, capsys, "preflight", f"--params={REPO / 'params.yaml'}", f"--set=tracking.uri=sqlite:///{store}",
                                    f"--set=tracking.artifact_root={tmp_path / 'art'}", "--set=pipeline.name=ready")
    assert code == 0 and "preflight ok" in out, err
    experiment = MlflowClient(f"sqlite:///{store}").get_experiment_by_name("ready")
    assert experiment is not None and experiment.artifact_location == (tmp_path / "art").as_uri()
    code, _, err = posttrain_main(monkeypatch, capsys, "preflight", f"--params={REPO / 'params.yaml'}", f"--set=tracking.uri=sqlite:///{store}",
                                  f"--set=tracking.artifact_root={tmp_path / 'art'}", "--set=pipeline.name=ready")
    assert code == 0, err  # a second preflight (a retried task) takes the experiment it made
    code, _, err = posttrain_main(monkeypatch, capsys, "preflight", f"--params={REPO / 'params.yaml'}", f"--set=tracking.uri=sqlite:///{store}",
                                  f"--set=tracking.artifact_root={tmp_path / 'elsewhere'}", "--set=pipeline.name=ready")
    assert code == 2 and "keeps its artifacts in" in err and len(err.strip().splitlines()) == 1


def test_a_stage_that_loses_the_race_to_create_the_experiment_takes_the_winners(tmp_path):
    from posttrain.tracking import pipeline_experiment

    made = SimpleNamespace(experiment_id="7", artifact_location=(tmp_path / "art").as_uri())
    answers = iter([None, made])  # absent when asked, there once the create failed: another stage made it

    class RacingMlflow:
        def get_experiment_by_name(self, name):
            return next(answers)

        def create_experiment(self, name, artifact_location):
            raise RuntimeError("UNIQUE constraint failed: experiments.name")

    cfg = SimpleNamespace(pipeline=SimpleNamespace(name="posttrain"))
    assert pipeline_experiment(RacingMlflow(), cfg, str(tmp_path / "art")) == "7"

    class BrokenMlflow(RacingMlflow):
        def get_experiment_by_name(self, name):
            return None

    with pytest.raises(RuntimeError, match="UNIQUE"):  # no experiment after all: the store's own error
        pipeline_experiment(BrokenMlflow(), cfg, str(tmp_path / "art"))
