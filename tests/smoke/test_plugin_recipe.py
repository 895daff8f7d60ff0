"""Adding a method needs no edit outside its folder: a throwaway recipe (a stage, a settings section and a reward)
as an installed plugin package in a temp dir, and every entry point sees it: `posttrain registry`, `posttrain
<its stage>` with `--set <its section>.<key>`, `dvc repro` of a dvc.yaml that runs it, and the generated Airflow
spec and Kubeflow pipeline (its section a parameter of its pipeline only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from helpers import POSTTRAIN, REPO, dvc, git, install_plugin, micro_params, tool_env

RECIPE = '''"""The hello recipe: a stage that writes a greeting, its settings section and a reward."""

from pydantic import Field

from posttrain.config import Section


class HelloSettings(Section):
    greeting: str = "hello"  # the word the hello stage writes
    times: int = Field(2, gt=0)  # how often it writes it


def register(registries):
    registries["sections"].register("hello", help="the hello recipe: what its stage writes")(HelloSettings)

    @registries["stages"].register("hello", sections=("hello",), inputs={}, resumable=False, gpu=False)
    def run(cfg, inputs, out_dir, tracker, resume=False):
        """Stage `hello`: the greeting, hello.times times."""
        (out_dir / "greeting.txt").write_text(" ".join([cfg.hello.greeting] * cfg.hello.times))
        return {"words": float(cfg.hello.times)}

    @registries["rewards"].register("shouted")
    def shouted(task, examples, completions, finished):
        """1 for a completion in capitals."""
        import torch

        return torch.tensor([float(c.isupper()) for c in completions])
'''

DVC_YAML = {"stages": {"hello": {"cmd": "posttrain hello --out outputs/hello --launcher dvc", "params": ["hello"],
                                 "outs": ["outputs/hello/greeting.txt"]}}}

SPECS = '''
import json, sys
from pathlib import Path
from kfp import compiler
from pipelines.build import build_all
from posttrain.orchestration.schema import pipeline_spec

params, repo = Path(sys.argv[1]), Path(sys.argv[2])
spec = pipeline_spec(params, repo)
compiler.Compiler().compile(build_all(params, repo)["text"], str(repo / "text.yaml"))
print(json.dumps({"tasks": spec["pipelines"]["text"], "params": {k: v for k, v in spec["params"].items() if k.startswith("hello.")}}))
'''


def test_a_throwaway_recipe_plugin_is_seen_by_the_cli_dvc_and_the_launchers(tmp_path):
    install_plugin(tmp_path / "site", "hello_recipe", RECIPE, "hello = hello_recipe:register")
    micro_params(tmp_path, tracking={"enabled": False})
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["hello"] = {"greeting": "hi"}  # the recipe's section in the user's params file
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    path = os.pathsep.join(filter(None, [str(tmp_path / "site"), str(REPO), os.environ.get("PYTHONPATH")]))
    env = tool_env(PYTHONPATH=path)

    def run(*args, cwd=tmp_path):
        result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    listed = json.loads(run(POSTTRAIN, "registry", "--json"))
    assert "hello" in listed["stages"] and "hello" in listed["sections"] and "shouted" in listed["rewards"]

    run(POSTTRAIN, "hello", "--set", "hello.times=3", "--out", "outputs/hello")
    assert (tmp_path / "outputs" / "hello" / "greeting.txt").read_text() == "hi hi hi"
    bad = subprocess.run([POSTTRAIN, "hello", "--set", "hello.times=0", "--out", "outputs/bad"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "hello.times" in bad.stderr  # its section is checked
    assert not (tmp_path / "outputs" / "bad").exists()

    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(DVC_YAML, sort_keys=False))
    git("init", "-q", cwd=tmp_path)
    dvc("init", "-q", cwd=tmp_path)
    dvc("config", "core.analytics", "false", cwd=tmp_path)
    (tmp_path / "outputs" / "hello" / "greeting.txt").unlink()
    run(sys.executable, "-m", "dvc", "repro", "-q")
    assert (tmp_path / "outputs" / "hello" / "greeting.txt").read_text() == "hi hi"  # params.yaml's greeting, the default times

    seen = json.loads(run(sys.executable, "-c", SPECS, str(tmp_path / "params.yaml"), str(tmp_path), cwd=REPO))
    assert [t["stage"] for t in seen["tasks"]] == ["hello"] and seen["tasks"][0]["sections"] == ["hello"]
    assert seen["params"]["hello.greeting"]["default"] == "hi"  # the Airflow form's field, with the file's value
    assert seen["params"]["hello.greeting"]["description"] == "the word the hello stage writes"
    compiled = next(yaml.safe_load_all((tmp_path / "text.yaml").read_text()))  # the pipeline spec, then the platform spec
    inputs = compiled["root"]["inputDefinitions"]["parameters"]
    assert inputs["hello"]["defaultValue"] == {"greeting": "hi", "times": 2}  # a Kubeflow parameter of its pipeline
    assert "hello" in json.dumps(compiled["deploymentSpec"])  # the task runs `posttrain hello`
