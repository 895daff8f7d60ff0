"""S3 round trips against a loopback moto server: MLflow artifacts, the DVC remote, and preflight's checks."""

from __future__ import annotations

import json
import subprocess

import pytest
from orch_helpers import dvc, tiny_params

from helpers import micro_params, moto_server, posttrain, posttrain_in_process


@pytest.fixture(scope="module")
def s3_endpoint():
    with moto_server("posttrain-test") as (endpoint, _):
        yield endpoint


def test_mlflow_artifacts_go_to_s3_and_preflight_checks_the_bucket(s3_endpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    params = micro_params(tmp_path)
    params.write_text(params.read_text().replace(f"artifact_root: {tmp_path / 'mlartifacts'}", "artifact_root: s3://posttrain-test/mlartifacts"))
    assert "preflight ok" in posttrain("preflight", cwd=tmp_path).stdout
    posttrain("data", cwd=tmp_path)

    import boto3

    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=s3_endpoint).list_objects_v2(Bucket="posttrain-test")["Contents"]]
    assert any(k.startswith("mlartifacts/") and k.endswith("data/train.jsonl") for k in keys), keys

    missing = posttrain("preflight", "--set", "tracking.artifact_root=s3://no-such-bucket/x", cwd=tmp_path, check=False)
    assert missing.returncode == 2 and "s3://no-such-bucket" in missing.stderr
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    anonymous = posttrain("preflight", cwd=tmp_path, check=False)
    assert anonymous.returncode == 2 and "no AWS credentials" in anonymous.stderr


def test_dvc_remote_on_s3_pushes_and_pulls(s3_endpoint, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    dvc("init", "--no-scm", "-q", cwd=repo)
    dvc("remote", "add", "-d", "storage", "s3://posttrain-test/dvc", cwd=repo)
    dvc("remote", "modify", "storage", "endpointurl", s3_endpoint, cwd=repo)
    data = repo / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "completion": "2"}\n')
    dvc("add", "train.jsonl", cwd=repo)
    dvc("push", cwd=repo)
    data.unlink()
    subprocess.run(["rm", "-rf", str(repo / ".dvc" / "cache")], check=True)
    dvc("pull", cwd=repo)
    assert data.read_text() == '{"prompt": "1+1=", "completion": "2"}\n'
    assert "AWS_SECRET_ACCESS_KEY" not in (repo / ".dvc" / "config").read_text() and "testing" not in (repo / ".dvc" / "config").read_text()


def test_a_stage_reads_an_existing_dataset_by_its_s3_uri(s3_endpoint, tmp_path, monkeypatch):
    """`--in data=s3://...` (what orchestration.imports hands a consumer) trains exactly as the local directory does."""
    import boto3

    from posttrain import resolve
    from posttrain.orchestration.preflight import preflight
    from posttrain.storage import local_path

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    cfg = resolve.load(tiny_params(tmp_path, tracking={"enabled": False}, sft={"steps": 3, "batch_size": 8, "log_every": 1}))
    posttrain_in_process("data")
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    for path in (tmp_path / "outputs" / "data").iterdir():
        client.upload_file(str(path), "posttrain-test", f"datasets/arith/{path.name}")
    uri = "s3://posttrain-test/datasets/arith"
    assert preflight(cfg, {"data": uri}) == []
    assert preflight(cfg, {"data": "s3://posttrain-test/datasets/nothing"}) == ["s3://posttrain-test/datasets/nothing has no objects"]
    posttrain_in_process("sft", "--in", f"data={uri}", "--out", "outputs/sft_s3")
    posttrain_in_process("sft", "--out", "outputs/sft_local")
    read = lambda name: json.loads((tmp_path / "outputs" / name / "metrics.json").read_text())  # noqa: E731
    assert read("sft_s3") == read("sft_local")
    cached = local_path(uri)
    assert cached.parent == tmp_path / "cache" and (cached / "train.jsonl").read_bytes() == (tmp_path / "outputs" / "data" / "train.jsonl").read_bytes()
    (cached / "train.jsonl").write_text("stale")  # the listing is unchanged: the cache is trusted, not re-read
    assert local_path(uri) == cached and (cached / "train.jsonl").read_text() == "stale"
    client.put_object(Bucket="posttrain-test", Key="datasets/arith/train.jsonl", Body=b"new")
    assert (local_path(uri) / "train.jsonl").read_text() == "new"  # a changed object is fetched again


def test_the_data_stage_reads_your_problems_from_s3_as_from_the_local_file(s3_endpoint, tmp_path, monkeypatch):
    """task.name dataset with `path: s3://bucket/problems.jsonl` (one object, fetched into the input cache) gives
    the same examples and metrics as the local file."""
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    micro_params(tmp_path, tracking={"enabled": False})
    rows = [{"problem": f"What is {i} + {i % 7}?", "answer": i + i % 7, "level": i % 3} for i in range(40)] + [{"problem": "What is 1 + 1?", "answer": 2, "level": 0}]
    (tmp_path / "problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    boto3.client("s3", endpoint_url=s3_endpoint).upload_file(str(tmp_path / "problems.jsonl"), "posttrain-test", "mine/problems.jsonl")
    mapping = ["--set", "task.name=dataset", "--set", "task.options.dataset.fields.prompt=problem", "--set", "task.options.dataset.fields.metadata=all"]
    for name, path in (("local", "problems.jsonl"), ("s3", "s3://posttrain-test/mine/problems.jsonl")):
        posttrain_in_process("data", *mapping, "--set", f"task.options.dataset.path={path}", "--out", f"outputs/{name}")
    read = lambda name, file: (tmp_path / "outputs" / name / file).read_bytes()  # noqa: E731
    for file in ("train.jsonl", "heldout.jsonl", "metrics.json"):
        assert read("s3", file) == read("local", file), file
    metrics = json.loads(read("s3", "metrics.json"))
    assert (metrics["n_rows_read"], metrics["n_duplicates_dropped"], metrics["n_train"] + metrics["n_heldout"]) == (41, 1, 40)
    assert json.loads(read("s3", "train.jsonl").splitlines()[0])["metadata"] == {"level": 0}
