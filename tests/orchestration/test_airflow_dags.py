"""The Airflow DAGs as DagBag reads them: they load, take the generated Params, and render their commands and pods.
(Runs triggered through a real api-server, scheduler and dag-processor: test_airflow_servers.py.)"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
import yaml
from airflow_servers import DAGS, airflow_env
from orch_helpers import BIN

from helpers import repo_params, REPO
from posttrain.orchestration.schema import param_specs


@pytest.fixture(scope="module")
def dag_probe(tmp_path_factory) -> dict:
    """What DagBag sees of the DAG files, read in a fresh interpreter (as Airflow's dag-processor does)."""
    probe = f"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag({str(DAGS)!r})
heavy = sorted({{m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('torch', 'posttrain', 'transformers')}})
params = {{d: {{k: [p.value, p.schema, p.description] for k, p in dag.params.items()}} for d, dag in bag.dags.items()}}
commands = {{d: {{t: getattr(op, "bash_command", "") for t, op in dag.task_dict.items()}} for d, dag in bag.dags.items()}}
sweep, text = bag.dags["posttrain_sweep"], bag.dags["posttrain_text"]
objectives = sweep.params.get_param("objectives")
refused = {{}}
for name, value in {{"twice": ["rloo", "rloo"], "unknown": ["grpo", "nope"], "none": []}}.items():
    try:
        objectives.resolve(value)
    except Exception as e:
        refused[name] = str(e)
filters = text.user_defined_filters
class TI:  # what the finalize template hands `pipeline_state`: the running task instance
    dag_id, run_id, task_id = "posttrain_text", "r1", "finalize"
    def __init__(self, states): self.states = states
    def get_task_states(self, dag_id, run_ids): return {{"r1": self.states}} if (dag_id, run_ids) == ("posttrain_text", ["r1"]) else {{}}
states = {{name: filters["pipeline_state"](TI(s)) for name, s in {{
    "all_ok": {{"preflight": "success", "sft": "success", "finalize": "running"}},
    "one_failed": {{"preflight": "success", "sft": "failed", "rl": "upstream_failed", "finalize": "running"}},
    "marked_failed": {{"preflight": "success", "sft": "success", "rl": "skipped", "finalize": "running"}},
    "arm_failed": {{"preflight": "success", "objective_1": "failed", "finalize": "running"}}}}.items()}}
print(json.dumps({{"errors": {{k: str(v) for k, v in bag.import_errors.items()}}, "heavy": heavy, "params": params,
    "tasks": {{d: sorted(dag.task_dict) for d, dag in bag.dags.items()}}, "commands": commands, "refused": refused,
    "objectives": [objectives.value, objectives.schema], "states": states,
    "conf": filters["conf_settings"]({{"rl.stepz": 5, "objectives": ["grpo"]}}), "env": text.task_dict["preflight"].env,
    "emptied": [filters["config_values"]({{"sft.steps": None, "rl.preset": None, "rl.advantage": None, "rl.steps": 7, "objectives": None}}),
                filters["conf_settings"]({{"sft.steps": None, "rl.preset": None}}), filters["objectives_of"]({{"objectives": None}}),
                filters["objectives_of"]({{"objectives": ["rloo"]}})],
    # the UI's rule: required when the schema has a type that is not a list holding "null" (`anyOf` types are not)
    "required": {{d: sorted(k for k, p in dag.params.items() if p.schema.get("type") and not (isinstance(p.schema["type"], list) and "null" in p.schema["type"]))
                 for d, dag in bag.dags.items()}},
    "validates": {{k: [text.params.get_param(k).resolve(None) is None] for k in ("sft.steps", "rl.advantage", "rl.rewards")}},
    "teardown": [text.task_dict["finalize"].is_teardown, text.task_dict["finalize"].on_failure_fail_dagrun, text.task_dict["finalize"].retries],
    "retry": {{t: [text.task_dict[t].retries, text.task_dict[t].retry_delay.total_seconds()] for t in ("preflight", "rl")}}}}))
"""
    env = airflow_env(tmp_path_factory.mktemp("dagbag"), POSTTRAIN_AIRFLOW_RETRIES="3", POSTTRAIN_AIRFLOW_RETRY_DELAY="7s")
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_dagbag_loads_without_torch_or_posttrain_and_params_match_the_config(dag_probe):
    found = dag_probe
    assert found["errors"] == {} and found["heavy"] == []
    assert {"posttrain_text", "posttrain_sweep"} <= set(found["tasks"])
    assert {"preflight", "data", "sft", "rl", "distill", "eval_sft", "eval_rl", "finalize"} == set(found["tasks"]["posttrain_text"])
    assert {"objective", "compare", "finalize"} <= set(found["tasks"]["posttrain_sweep"])
    assert {"preflight", "city", "curate", "flow_sft", "flow_rl", "flow_eval", "finalize"} == set(found["tasks"]["posttrain_image"])
    assert {"data", "sft", "reward_model", "rl_rm", "preference", "eval_rl_rm", "eval_preference"} < set(found["tasks"]["posttrain_rlhf"])
    image = found["commands"]["posttrain_image"]  # its own experiment, for the stages and for marking runs FAILED
    assert all("--set pipeline.name=posttrain-images" in image[t] for t in ("preflight", "finalize"))
    assert "/outputs/images/curate'" in image["flow_rl"] and "--set" not in image["flow_rl"]
    everything = param_specs(REPO / "params.yaml")
    # each form holds the sections its DAG's stages read (their dvc.yaml `params:`) and the run-wide ones, no other
    run_wide = {"pipeline", "tracking", "training"}
    read = {"posttrain_text": {"task", "model", "sft", "rl", "distill", "eval"}, "posttrain_sweep": {"task", "model", "sft", "rl", "distill", "eval"},
            "posttrain_image": {"city", "curate", "flow", "flow_sft", "flow_rl", "flow_eval"},
            "posttrain_rlhf": {"task", "model", "sft", "rl", "eval", "reward_model", "preference", "care", "edit"},
            "posttrain_dsp": {"dsp"}, "posttrain_rfpo": {"task", "model", "sft", "rl", "eval", "critic"}}
    for dag, sections in read.items():
        shown = {name for name in found["params"][dag] if name != "objectives"}
        assert shown == {name for name, spec in everything.items() if spec["section"] in sections | run_wide}, dag
    expected = {name: spec for name, spec in everything.items() if spec["section"] in read["posttrain_text"] | run_wide}
    text_params = found["params"]["posttrain_text"]
    assert "flow_rl.steps" not in text_params and "care.rl_steps" not in text_params and "rl.steps" in found["params"]["posttrain_rlhf"]
    for name, spec in expected.items():
        default, schema, description = text_params[name]
        assert default == spec["default"] and description == spec["description"], name
        kind = spec["schema"].get("type")  # the form's type also admits null (the form marks required what does not)
        assert schema == {**spec["schema"], "section": spec["section"], **({} if kind is None else {"type": [kind, "null"]}),
                          **({"enum": [*spec["schema"]["enum"], None], "values_display": {"null": f"default: {json.dumps(default)}"}} if "enum" in spec["schema"] else {})}, name
    assert "gdpo" in text_params["rl.advantage"][1]["enum"]
    # a recipe's pipeline (recipes/dsp/dvc.yaml) is a DAG of its own, run on the recipe's own params file
    assert {"preflight", "maze_data", "dsp", "finalize"} == set(found["tasks"]["posttrain_dsp"])
    assert all("/recipes/dsp/params.yaml" in found["commands"]["posttrain_dsp"][t] for t in ("preflight", "finalize"))
    assert "dsp.steps" in found["params"]["posttrain_dsp"] and not any(name.startswith("dsp.") for name in text_params)
    # preflight and finalize check the sections the DAG's stages read, and no other: a bad dsp value stops no text run
    text_stages = {"data", "sft", "rl", "distill", "eval"}
    for dag, stages in {"posttrain_text": text_stages, "posttrain_sweep": text_stages | {"compare"}, "posttrain_dsp": {"maze_data", "dsp"}}.items():
        for task_id in ("preflight", "finalize"):
            argv = shlex.split(found["commands"][dag][task_id])
            assert {argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--stage"} == stages, (dag, task_id)
    # recipes/rfpo/dvc.yaml starts from the core pipeline's data and sft, on the recipe's params file (which adds `critic`)
    assert {"preflight", "data", "sft", "critic", "rl_rfpo", "eval_rl_rfpo", "finalize"} == set(found["tasks"]["posttrain_rfpo"])
    assert all("/recipes/rfpo/params.yaml" in found["commands"]["posttrain_rfpo"][t] for t in ("preflight", "finalize"))
    assert "critic.steps" in found["params"]["posttrain_rfpo"] and not any(name.startswith("critic.") for name in text_params)
    # recipes/search/dvc.yaml reads two params files: a DAG per file, each stage on its own (bridge's other task and model)
    assert {"preflight", "asct", "finalize"} == set(found["tasks"]["posttrain_search"])
    assert {"preflight", "bridge", "finalize"} == set(found["tasks"]["posttrain_search_bridge"])
    assert all("/recipes/search/bridge.yaml" in found["commands"]["posttrain_search_bridge"][t] for t in ("preflight", "finalize"))
    assert found["params"]["posttrain_search_bridge"]["task.n_train"][0] == 12 and found["params"]["posttrain_search"]["task.n_train"][0] == 1000
    # the form's help text is the comment on the setting's line in its settings model (continued by aligned comment
    # lines, or the comment lines right above it), else the key and its default
    assert text_params["rl.preset"][2].startswith("a named method (objectives/presets.py)")
    assert text_params["rl.verify_rollouts"][2].startswith("the `accuracy` metric: each rollout scored by the task's verifier")
    assert text_params["rl.steps"][2] == "rl.steps (default: 1000)"


def test_every_key_of_every_form_is_optional_and_an_emptied_field_takes_its_default(dag_probe):
    """Every setting has a default (params.yaml's), so no field of any trigger form is required: the UI marks a field
    required when its schema's type does not admit null, so the form's types do. An emptied field (null) is left out
    of the values preflight reads, so the run takes params.yaml's value; a key whose own schema admits null
    (`rl.preset`) keeps null as its value."""
    found = dag_probe
    assert found["required"] == {dag: [] for dag in found["required"]}, found["required"]
    assert found["validates"] == {"sft.steps": [True], "rl.advantage": [True], "rl.rewards": [True]}  # null passes the trigger's validation
    values, conf, arms_default, arms = found["emptied"]
    assert values == {"rl.preset": None, "rl.steps": 7} and conf == {"rl.preset": None}
    assert arms_default == ["grpo", "rloo", "dr_grpo"] and arms == ["rloo"]
    from posttrain.orchestration.preflight import resolve_config

    cfg = resolve_config(REPO / "params.yaml", [json.dumps(values), json.dumps(conf)], [])
    defaults = repo_params()
    assert (cfg.sft.steps, cfg.rl.advantage, cfg.rl.steps, cfg.rl.preset) == (defaults["sft"]["steps"], defaults["rl"]["advantage"], 7, None)


def test_dag_runs_refuse_unknown_conf_keys_duplicate_arms_and_end_failed_when_a_task_failed(dag_probe):
    found = dag_probe
    # the trigger's conf (less the sweep's arms) reaches preflight as given, so `rl.stepz` is refused by name there
    assert found["conf"] == {"rl.stepz": 5} and found["env"]["POSTTRAIN_CONF"] == "{{ dag_run.conf | conf_settings | tojson }}"
    for dag in ("posttrain_text", "posttrain_sweep", "posttrain_image", "posttrain_rlhf"):
        assert '--values-json "$POSTTRAIN_CONF"' in found["commands"][dag]["preflight"], dag
    from posttrain.orchestration.preflight import resolve_config
    from posttrain.errors import UserError

    with pytest.raises(UserError, match="unknown key 'rl.stepz'"):
        resolve_config(REPO / "params.yaml", [json.dumps(found["conf"])], [])
    # the arms: a multi-select of presets and advantages, each once, checked when the run is triggered
    default, schema = found["objectives"]
    assert default == ["grpo", "rloo", "dr_grpo"] and schema["uniqueItems"] is True and {"dapo", "gspo", "rloo", "dr_grpo"} <= set(schema["items"]["enum"])
    assert schema["examples"] == schema["items"]["enum"]
    assert set(found["refused"]) == {"twice", "unknown", "none"}, found["refused"]
    assert "--sweep-arms" in found["commands"]["posttrain_sweep"]["preflight"]
    # finalize fails its run when another task failed or was skipped (a run marked failed), and has no retries
    assert found["states"] == {"all_ok": "ended", "one_failed": "failed", "marked_failed": "failed", "arm_failed": "failed"}
    assert found["teardown"] == [True, True, 0]
    # the environment's retries and first delay (POSTTRAIN_AIRFLOW_RETRIES, _RETRY_DELAY) on every task but preflight
    assert found["retry"] == {"preflight": [0, 7.0], "rl": [3, 7.0]}
    assert "--state '{{ ti | pipeline_state }}' --fail-if-failed" in found["commands"]["posttrain_text"]["finalize"]


def test_kubernetes_executor_makes_pods_with_secrets_from_kubernetes_gpus_and_the_runs_volume(tmp_path):
    """orchestration.airflow.executor = kubernetes: every task a KubernetesPodOperator; its pod (rendered by the
    provider, no cluster) takes credentials from secretKeyRef only, training pods request the GPU node pool."""
    probe = f"""
import json
from airflow.dag_processing.dagbag import DagBag
from kubernetes.client import ApiClient
bag = DagBag({str(DAGS)!r})
pods = {{t: ApiClient().sanitize_for_serialization(op.build_pod_request_obj()) for t, op in bag.dags["posttrain_text"].task_dict.items()}}
sweep = bag.dags["posttrain_sweep"]
arm = sweep.task_dict["objective"]  # a mapped operator: its class is MappedOperator, its task_type the operator's
limits = arm.partial_kwargs["container_resources"].limits
commands = sweep.task_dict["objective_commands"].python_callable(run_dir="/opt/runs/r1", params={{"objectives": ["dr_grpo", "rloo"]}})
# task_type sees through mapping (type(op) of a mapped task is MappedOperator, whatever it maps)
kinds = {{(d, t): op.task_type for d, dag in bag.dags.items() for t, op in dag.task_dict.items()}}
print(json.dumps({{"errors": {{k: str(v) for k, v in bag.import_errors.items()}}, "pods": pods, "arm_limits": limits, "arm_commands": commands,
    "kinds": {{f"{{d}}/{{t}}": k for (d, t), k in kinds.items()}}, "mapped": type(arm).__name__}}))
"""
    env = airflow_env(tmp_path)
    env.pop("POSTTRAIN_RUNS_DIR")
    kubeconfig = {  # the provider reads a cluster config to build the pod; nothing connects to it
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}], "users": [{"name": "test", "user": {}}],
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    env.update(POSTTRAIN_AIRFLOW_EXECUTOR="kubernetes", AWS_SECRET_ACCESS_KEY="do-not-leak-7c2", KUBECONFIG=str(tmp_path / "kubeconfig"))
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["errors"] == {}
    # every task of every DAG is a pod, the sweep's mapped arms too; only the sweep's list of arm commands runs in Airflow
    python_tasks = {name for name, kind in found["kinds"].items() if kind != "KubernetesPodOperator"}
    assert python_tasks == {"posttrain_sweep/objective_commands"}, python_tasks
    assert found["mapped"] == "MappedOperator" and found["kinds"]["posttrain_sweep/objective"] == "KubernetesPodOperator"
    assert found["arm_limits"] == {"nvidia.com/gpu": "1"}  # an arm trains: the GPU node pool
    dr_grpo, rloo = found["arm_commands"]  # a pod's arguments: one shell command, in the image's posttrain
    assert dr_grpo[0].startswith("posttrain preflight ") and "--sweep-arm dr_grpo" in dr_grpo[0] and "--sweep-arm rloo" in rloo[0]
    assert "/objectives/dr_grpo/outputs/rl" in dr_grpo[0] and str(BIN) not in dr_grpo[0]
    assert "do-not-leak-7c2" not in result.stdout
    for task_id, pod in found["pods"].items():
        (container,) = pod["spec"]["containers"]
        assert container["image"] == "ghcr.io/posttrain/posttrain:0.1.0", task_id
        secret_env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if e.get("valueFrom")}
        assert secret_env["AWS_SECRET_ACCESS_KEY"] == {"key": "AWS_SECRET_ACCESS_KEY", "name": "posttrain-credentials"}, task_id
        assert "AWS_SECRET" not in " ".join(container["args"])  # never templated into the command
        assert container["args"][0].startswith("posttrain ") and "/opt/posttrain/airflow-runs/{{ run_id }}" in container["args"][0], task_id
        assert {"mountPath": "/opt/posttrain/airflow-runs", "name": "runs"} in container["volumeMounts"]
        assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "posttrain-runs"
        gpu = container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        assert (gpu == "1") == (task_id in {"sft", "rl", "distill", "eval_sft", "eval_rl"}), task_id
        assert bool(pod["spec"].get("tolerations")) == (gpu == "1"), task_id
