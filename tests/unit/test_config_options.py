"""Per-method settings under rl.options: validated against the options model a component registers."""

from __future__ import annotations


import pytest
import yaml
from pydantic import Field

from posttrain import resolve
from posttrain.config import Section
from posttrain.errors import UserError
from posttrain.objectives import advantages
from helpers import repo_params


class ToyOptions(Section):
    strength: float = Field(gt=0)
    mode: str


@pytest.fixture
def toy_estimator():
    advantages.register("toy_with_options", options=ToyOptions)(lambda batch, cfg: batch.rewards[:, 0])
    yield "toy_with_options"
    del advantages._entries["toy_with_options"]


def params_with(tmp_path, options) -> str:
    raw = repo_params()
    raw["rl"]["options"] = options
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_options_are_validated_and_typed(toy_estimator, tmp_path):
    path = params_with(tmp_path, {toy_estimator: {"strength": 0.5, "mode": "add"}})
    cfg = resolve.load(path, [f"rl.advantage={toy_estimator}", f"rl.options.{toy_estimator}.strength=2"])
    opts = cfg.rl.options_for(toy_estimator)
    assert isinstance(opts, ToyOptions) and opts.strength == 2.0 and opts.mode == "add"


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["rl.options.toy_with_options.strenght=1"], "unknown key 'rl.options.toy_with_options.strenght' (did you mean 'rl.options.toy_with_options.strength'?)"),
        (["rl.options.toy_with_options.strength=-1"], "rl.options.toy_with_options.strength: Input should be greater than 0"),
        (["rl.options.nobody.x=1"], "rl.options.nobody: no registered estimator, loss, reward, auxiliary term, off-policy correction, pool policy or sampler named 'nobody' takes options"),
    ],
)
def test_bad_options_are_one_line_errors_naming_the_key(toy_estimator, tmp_path, overrides, needle):
    path = params_with(tmp_path, {toy_estimator: {"strength": 0.5, "mode": "add"}})
    with pytest.raises(UserError) as err:
        resolve.load(path, overrides)
    assert str(err.value) == needle or str(err.value).startswith(needle)
    assert "\n" not in str(err.value)


def test_selected_method_without_its_options_is_an_error(toy_estimator, tmp_path):
    path = params_with(tmp_path, {})
    with pytest.raises(UserError, match="rl.options.toy_with_options: needs settings"):
        resolve.load(path, [f"rl.advantage={toy_estimator}"])


def test_a_set_value_holding_a_hash_is_not_cut_by_yaml_comments():
    from posttrain.config import override_value
    from posttrain.errors import UserError

    prompt = "Answer with the calculation, then #### and the number. Example: 12 - 5 = 7 #### 7"
    assert override_value("k", prompt) == prompt and override_value("k", "#### 7") == "#### 7"
    assert override_value("k", "'quoted #### 7'") == "quoted #### 7" and override_value("k", '["####"]') == ["####"]
    assert override_value("k", "3") == 3 and override_value("k", "[a, b]") == ["a", "b"] and override_value("k", "null") is None
    with pytest.raises(UserError, match="starts a YAML comment"):
        override_value("k", "[a, b] #c")
