"""config.load: params.yaml defaults, --set overrides, and one-line UserErrors that name the key."""

from __future__ import annotations

import os

import pytest
import yaml
from pydantic import ValidationError

from posttrain.config import Config, read_params

from posttrain.resolve import load
from posttrain.errors import UserError


def load_error(params_path, *overrides: str) -> str:
    with pytest.raises(UserError) as info:
        load(params_path, list(overrides))
    message = str(info.value)
    assert "\n" not in message, message
    return message


def write_params(tmp_path, params_path, mutate) -> str:
    raw = yaml.safe_load(params_path.read_text())
    mutate(raw)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_defaults_load(cfg, params_path):
    assert isinstance(cfg, Config)
    raw = yaml.safe_load(params_path.read_text())
    assert cfg.rl.group_size == raw["rl"]["group_size"]
    assert cfg.rl.advantage == "grpo" and cfg.rl.loss == "clip"
    assert [r.name for r in cfg.rl.rewards] == [r["name"] for r in raw["rl"]["rewards"]]
    assert cfg.model.lora.r == raw["model"]["lora"]["r"]
    assert cfg.task.operations == tuple(raw["task"]["operations"])


def test_overrides_parse_yaml_values(params_path):
    cfg = load(params_path, ["task.operations=['+','-']", "rl.lr=0.25", "tracking.enabled=false", "model.path=null"])
    assert cfg.task.operations == ("+", "-")
    assert cfg.rl.lr == 0.25
    assert cfg.tracking.enabled is False
    assert cfg.model.path is None


def test_nested_override(params_path):
    cfg = load(params_path, ["model.lora.r=4", "model.lora.target_modules=[q_proj]"])
    assert cfg.model.lora.r == 4
    assert cfg.model.lora.target_modules == ("q_proj",)
    assert cfg.model.lora.alpha == load(params_path).model.lora.alpha  # siblings keep their defaults


def test_override_rewards_list(params_path):
    cfg = load(params_path, ["rl.rewards=[{name: correctness, weight: 2.0}]"])
    assert len(cfg.rl.rewards) == 1 and cfg.rl.rewards[0].weight == 2.0


def test_later_override_wins(params_path):
    assert load(params_path, ["rl.steps=3", "rl.steps=5"]).rl.steps == 5


def test_config_is_frozen(cfg):
    with pytest.raises(ValidationError):
        cfg.rl.lr = 1.0
    with pytest.raises(ValidationError):
        cfg.rl = cfg.rl


def test_section_hash(params_path):
    base = load(params_path)
    rl_changed = load(params_path, ["rl.lr=0.123"])
    eval_changed = load(params_path, ["eval.n_prompts=7"])
    assert base.section_hash("rl") == load(params_path).section_hash("rl")
    assert base.section_hash("rl") != rl_changed.section_hash("rl")
    assert base.section_hash("rl", "model") != rl_changed.section_hash("rl", "model")
    assert base.section_hash("rl", "model") == eval_changed.section_hash("rl", "model")
    assert base.section_hash("eval") != eval_changed.section_hash("eval")


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("foo.bar=1", ["foo"]),
        ("rl.stpes=3", ["rl.stpes", "did you mean 'rl.steps'"]),
        ("model.lora.rr=2", ["model.lora.rr", "did you mean 'model.lora.r'"]),
        ("rl.steps=abc", ["rl.steps"]),
        ("rl.steps=2.5", ["rl.steps"]),
        ("tracking.enabled=maybe", ["tracking.enabled"]),
        ("rl.steps=0", ["rl.steps"]),
        ("rl.lr=-1", ["rl.lr"]),
        ("rl.std_eps=0", ["rl.std_eps"]),
        ("rl.group_size=1", ["rl.group_size"]),
        ("model.lora.r=-1", ["model.lora.r"]),
        ("task.digits=0", ["task.digits"]),
        ("task.operations=[]", ["task.operations"]),
        ("task.operations=['/']", ["task.operations"]),
        ("pipeline.device=tpu", ["pipeline.device"]),
        ("rl.std_scaling=median", ["rl.std_scaling"]),
        ("rl.advantage=grpoo", ["rl.advantage", "did you mean 'grpo'"]),
        ("rl.loss=clipp", ["rl.loss", "did you mean 'clip'"]),
        ("rl.loss_agg=tokenmean", ["rl.loss_agg", "'token_mean'"]),
        ("rl.rewards=[{name: corectness}]", ["rl.rewards.0.name", "did you mean 'correctness'"]),
        ("rl.rewards=[{name: format}, {name: format}]", ["rl.rewards"]),
        ("rl.rewards=[]", ["rl.rewards"]),
        ("task.name=arithmatic", ["task.name", "did you mean 'arithmetic'"]),
        ("rl.steps.x=1", ["rl.steps"]),
        ("rl.steps=[1", ["rl.steps"]),
    ],
)
def test_bad_override_names_the_key(params_path, override, names):
    message = load_error(params_path, override)
    for name in names:
        assert name in message, message


def test_heads_must_divide_hidden_size(params_path):
    message = load_error(params_path, "model.heads=3", "model.kv_heads=1")
    assert "model" in message and "hidden_size" in message and "heads 3" in message


def test_kv_heads_must_divide_heads(params_path):
    message = load_error(params_path, "model.heads=8", "model.kv_heads=3")
    assert "kv_heads" in message


@pytest.mark.parametrize("item", ["rl.steps", "=3", ""])
def test_set_without_equals(params_path, item):
    assert "--set" in load_error(params_path, item)


def test_unknown_section_in_file(tmp_path, params_path):
    path = write_params(tmp_path, params_path, lambda raw: raw.update(trianing={"steps": 1}))
    assert "trianing" in load_error(path)


def test_unknown_key_in_file_suggests(tmp_path, params_path):
    path = write_params(tmp_path, params_path, lambda raw: raw["sft"].update(batchsize=3))
    message = load_error(path)
    assert "sft.batchsize" in message and "did you mean 'sft.batch_size'" in message


def test_unknown_nested_key_in_file_suggests(tmp_path, params_path):
    path = write_params(tmp_path, params_path, lambda raw: raw["model"]["lora"].update(alfa=3))
    message = load_error(path)
    assert "model.lora.alfa" in message and "did you mean 'model.lora.alpha'" in message


def test_a_key_missing_from_the_file_takes_its_models_default(tmp_path, params_path):
    from posttrain.config import RLConfig

    path = write_params(tmp_path, params_path, lambda raw: raw["rl"].pop("group_size"))
    assert load(path).rl.group_size == RLConfig.model_fields["group_size"].default
    empty = tmp_path / "empty.yaml"
    empty.write_text("pipeline: {seed: 3}\n")  # a file of one key: every other setting from the models
    assert load(empty).pipeline.seed == 3 and load(empty).rl.group_size == RLConfig.model_fields["group_size"].default


def test_wrong_type_in_file(tmp_path, params_path):
    path = write_params(tmp_path, params_path, lambda raw: raw["sft"].update(lr="fast"))
    assert "sft.lr" in load_error(path)


def test_missing_params_file(tmp_path):
    assert "not found" in load_error(tmp_path / "nope.yaml")


def test_invalid_yaml(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("rl: [unclosed\n  steps: 3\n")
    message = load_error(path)
    assert "YAML" in message and str(path) in message


def test_top_level_not_a_mapping(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("- a\n- b\n")
    assert str(path) in load_error(path)


@pytest.mark.parametrize("override, key", [
    ("rl.lr=.inf", "rl.lr"), ("sft.lr=.nan", "sft.lr"), ("rl.rewards=[{name: correctness, weight: .nan}]", "rl.rewards.0.weight"),
    ("rl.options.qglas.gamma_max=.inf", "rl.options.qglas.gamma_max"), ("flow_rl.noise_level=.inf", "flow_rl.noise_level"),
])
def test_non_finite_numbers_are_refused_naming_the_key(params_path, override, key):
    message = load_error(params_path, override)
    assert message.startswith(f"{key}: Input should be a finite number"), message


def test_a_params_file_extends_another_and_holds_only_its_changes(tmp_path, params_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "params.yaml").write_text(
        f"extends: {os.path.relpath(params_path, project)}\n"
        "task:\n  n_train: 123\n  options:\n    dataset:\n      fields:\n        metadata: [level]\n"
        "rl:\n  rewards:\n    - {name: correctness, weight: 1.0}\n")
    base, mine = load(params_path), load(project / "params.yaml", ["sft.steps=7"])
    assert (mine.task.n_train, mine.task.digits, mine.sft.steps, mine.model) == (123, base.task.digits, 7, base.model)
    dataset = read_params(project / "params.yaml")["task"]["options"]["dataset"]
    assert dataset["fields"] == {"metadata": ["level"]}  # the base file gives no dataset block: only the project's
    assert mine.task.options_for("dataset").fields.metadata == ("level",)
    assert [r.name for r in mine.rl.rewards] == ["correctness"]  # a list replaces the base's list
    (project / "loop.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(UserError, match="leads back to itself"):
        load(project / "loop.yaml")
    (project / "lost.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(UserError, match=r"params file not found: .*nowhere.yaml \(extended by .*lost.yaml\)"):
        load(project / "lost.yaml")
