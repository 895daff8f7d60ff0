"""No credential is logged: a stage run with credentials in `tracking.uri` and `tracking.artifact_root`, and secrets
in the AWS environment variables, leaves none of them in the MLflow store, the artifacts, the outputs or the
terminal; the URI credentials still authenticate (they are moved to the environment the clients read)."""

from __future__ import annotations

import base64
import threading
from pathlib import Path

import pytest

from helpers import posttrain_in_process

TRACKING_PASSWORD = "TrackPass-8d1f"
URI_KEY, URI_SECRET = "UriKeyId-55ab", "UriSecret-c3e9"
ENV_SECRET, ENV_TOKEN = "EnvSecret-77f0", "EnvToken-19bc"
SECRETS = (TRACKING_PASSWORD, URI_KEY, URI_SECRET, ENV_SECRET, ENV_TOKEN)


@pytest.fixture
def tracking_server(tmp_path, monkeypatch):
    """An MLflow tracking server on 127.0.0.1 over a SQLite store (its Flask app, served from a thread of this process,
    stopped at the end); yields its port, its store folder and the Authorization header of every request it got."""
    store = tmp_path / "tracking-server"
    store.mkdir()
    monkeypatch.setenv("_MLFLOW_SERVER_FILE_STORE", f"sqlite:///{store / 'server.db'}")
    monkeypatch.setenv("_MLFLOW_SERVER_REGISTRY_STORE", f"sqlite:///{store / 'server.db'}")
    monkeypatch.setenv("_MLFLOW_SERVER_ARTIFACT_ROOT", str(store / "artifacts"))
    from mlflow.server import app
    from werkzeug.serving import make_server

    authorizations = []
    serve = app.wsgi_app

    def recording(environ, start_response):
        authorizations.append(environ.get("HTTP_AUTHORIZATION"))
        return serve(environ, start_response)

    monkeypatch.setattr(app, "wsgi_app", recording)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port, store, authorizations
    finally:
        server.shutdown()
        thread.join(timeout=30)


def leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


@pytest.mark.filterwarnings("ignore:starlette.middleware.wsgi is deprecated")
def test_no_credential_reaches_mlflow_the_outputs_or_the_terminal(sft_workdir, s3, tracking_server, monkeypatch, capfd):
    import boto3
    from mlflow.tracking import MlflowClient

    port, store, authorizations = tracking_server
    endpoint, _, bucket = s3
    for name, value in {"AWS_SECRET_ACCESS_KEY": ENV_SECRET, "AWS_SESSION_TOKEN": ENV_TOKEN, "AWS_ENDPOINT_URL": endpoint,
                        "MLFLOW_S3_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(sft_workdir)
    tracking_uri = f"http://tracker:{TRACKING_PASSWORD}@127.0.0.1:{port}"
    artifact_root = f"s3://{URI_KEY}:{URI_SECRET}@{bucket}/secret-test"
    settings = ["--set", f"tracking.uri={tracking_uri}", "--set", f"tracking.artifact_root={artifact_root}"]
    terminal = posttrain_in_process("preflight", *settings) + posttrain_in_process("sft", *settings)

    # the credentials did their job
    assert f"Basic {base64.b64encode(f'tracker:{TRACKING_PASSWORD}'.encode()).decode()}" in authorizations
    client = MlflowClient(f"http://127.0.0.1:{port}")
    experiment = client.get_experiment_by_name("posttrain")
    assert experiment.artifact_location == f"s3://{bucket}/secret-test"
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["tracking.uri"] == f"http://127.0.0.1:{port}"
    s3_client = boto3.client("s3", endpoint_url=endpoint)
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket, Prefix="secret-test/")["Contents"]]
    assert any(k.endswith("artifacts/model/config.json") for k in keys), keys

    # and are nowhere else
    captured = capfd.readouterr()
    assert leaks(terminal + captured.out + captured.err) == []
    stored = [p for root in (store, sft_workdir) for p in Path(root).rglob("*") if p.is_file()]
    assert [str(p) for p in stored if leaks(p.read_bytes().decode("latin-1"))] == []
    objects = "".join(k + s3_client.get_object(Bucket=bucket, Key=k)["Body"].read().decode("latin-1") for k in keys)
    assert leaks(objects) == []
    assert leaks(str(run.data.params) + str(run.data.tags) + run.info.artifact_uri) == []


def test_uris_in_messages_lose_their_credentials():
    from posttrain.uris import redact_uri, split_credentials

    assert redact_uri("s3://KEY:SECRET@bucket/x") == "s3://bucket/x"
    assert redact_uri("cannot reach http://u:p@ss@host:5000/api and s3://a:b@bkt") == "cannot reach http://host:5000/api and s3://bkt"
    assert redact_uri("sqlite:///mlflow.db, me@example.com, /a/b@c") == "sqlite:///mlflow.db, me@example.com, /a/b@c"
    assert split_credentials("http://user:p%40ss@host:5000") == ("http://host:5000", "user", "p@ss")
    assert split_credentials("s3://bucket/x") == ("s3://bucket/x", None, None)


def test_a_credential_in_set_warns_without_echoing_it(capsys):
    """Issue 38 item 7: `--set` shows a secret in the process list; a key or URI that looks like one warns (the
    value is never printed), a plain setting does not."""
    from posttrain import resolve

    params = Path(__file__).resolve().parents[2] / "params.yaml"
    resolve.load(params, ["tracking.uri=http://alice:hunter2@127.0.0.1:5000"])
    err = capsys.readouterr().err
    assert "--set tracking.uri looks like it carries a credential" in err and "environment variables" in err
    assert "hunter2" not in err and len(err.strip().splitlines()) == 1
    resolve.load(params, ["tracking.uri=sqlite:///elsewhere.db", "rl.max_new_tokens=32", "eval.max_new_tokens=8"])
    assert capsys.readouterr().err == ""  # a token count is not a token
    from posttrain.resolve import _CREDENTIAL_KEY

    assert all(_CREDENTIAL_KEY.search(k) for k in ("hf_token", "token", "api_key", "apikey", "secret_access_key", "db_password"))
    assert not any(_CREDENTIAL_KEY.search(k) for k in ("max_new_tokens", "max_prompt_tokens", "tokens_per_s", "tokenizer"))
