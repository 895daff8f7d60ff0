"""Helpers for the orchestration tests: a tiny config and the tools of this environment on PATH."""

from __future__ import annotations

import contextlib
import threading
from http.server import ThreadingHTTPServer

from helpers import BIN, REPO, TINY, dvc, git, tiny_params, tool_env  # noqa: F401  (re-exported for the orchestration tests)


@contextlib.contextmanager
def loopback_server(handler):
    """An HTTP stand-in for a cluster API on 127.0.0.1, served from a thread of this test; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def check_side_pipeline(pipeline: dict) -> set[str]:
    """The stages of a dvc.yaml kept out of the default pipeline (safe_rl/, motion/, ...; `test_dvc_yaml.expanded_stages`
    of it): each runs from the repository root, runs the CLI stage of its name through the dvc launcher with inputs
    that stage takes, writes under its --out, names params keys that exist, and depends only on files of the repository
    or outputs of its own stages. Returns what its stages produce."""
    import shlex

    from posttrain.config import Config
    from posttrain.stages import stages

    produced = {o for s in pipeline.values() for o in s.get("outs", [])}
    for name, stage in pipeline.items():
        assert stage["wdir"] == "..", name
        argv = shlex.split(stage["cmd"])
        assert argv[0] == "posttrain" and argv[1] == name and argv[1] in stages and argv[argv.index("--launcher") + 1] == "dvc", name
        inputs = dict(argv[i + 1].split("=") for i, a in enumerate(argv) if a == "--in")
        assert set(inputs) <= set(stages.entry(argv[1]).meta["inputs"]), (name, inputs)
        out = argv[argv.index("--out") + 1]
        assert all(o.startswith(out + "/") for o in stage["outs"]), name
        for key in stage["params"]:  # a section, or a key of one (safe_rl.encoder)
            section, *rest = key.split(".")
            model = Config.model_fields[section].annotation
            for part in rest:
                assert part in model.model_fields, (name, key)
                model = model.model_fields[part].annotation
        for dep in stage["deps"]:
            assert not dep.startswith("outputs/") or dep in produced, (name, dep)
            assert (REPO / dep).exists() or dep.startswith("outputs/"), (name, dep)
    return produced
