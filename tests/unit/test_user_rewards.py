"""Rewards from the user's own code (`module:attr` names, rewards/user.py) and plugins by entry point
(posttrain/plugins.py): both end up as ordinary registry entries, checked at the boundary."""

from __future__ import annotations

import sys
import textwrap
from importlib.metadata import EntryPoint
from types import SimpleNamespace

import jsonschema
import pytest

from posttrain import resolve
from posttrain.errors import UserError
from posttrain.objectives import advantages
from posttrain.plugins import register_plugins
from posttrain.rewards import reward_matrix, rewards
from posttrain.rewards.user import example_columns
from posttrain.tasks import Example

USER_MODULE = '''
import math

def score(prompts, completions, answer, **metadata):
    """1 for the reference answer; None (unscored) for an empty completion, inf for "x"."""
    return [None if not c else math.inf if c == "x" else float(c == a) for c, a in zip(completions, answer)]

def echo_prompts(prompts, completions, **metadata):
    return [len(p) for p in prompts]

def boom(prompts, completions, **metadata):
    raise ValueError("cannot score\\nsecond line")

def too_few(prompts, completions, **metadata):
    return [1.0]

def words(prompts, completions, **metadata):
    return ["high"] * len(completions)

NOT_A_FUNCTION = 3
'''


@pytest.fixture
def registries_restored(monkeypatch):
    """Whatever a test registers into the global registries (or sys.path) is gone after it."""
    for registry in (rewards, advantages):
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture
def user_module(tmp_path, monkeypatch, registries_restored) -> str:
    """A module of reward functions in the working directory (not installed): its name."""
    name = f"user_rewards_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    yield name
    sys.modules.pop(name, None)


def load_with_rewards(params_path, *names: str):
    return resolve.load(params_path, ["rl.rewards=[" + ", ".join(f"{{name: '{n}'}}" for n in names) + "]"])


def test_a_module_attr_reward_is_imported_registered_and_scored(params_path, user_module):
    cfg = load_with_rewards(params_path, f"{user_module}:score", "correctness", f"{user_module}:echo_prompts")
    entry = rewards.entry(f"{user_module}:score")
    assert entry.meta == {"source": f"{user_module}:score"} and "reference answer" in entry.obj.__doc__
    task = SimpleNamespace(correctness_reward=lambda c, f, e: float(c == e.answer))
    examples = [Example("1+1=", "2", "2")] * 2 + [Example("10+1=", "11", "11")] * 2
    matrix, names, _ = reward_matrix(cfg.rl.rewards, task, examples, ["2", "3", "", "x"], [True] * 4)
    assert names == (f"{user_module}:score", "correctness", f"{user_module}:echo_prompts")
    assert matrix[:2, 0].tolist() == [1.0, 0.0] and matrix[2:, 0].isnan().all()  # None and inf: unscored
    assert matrix[:, 2].tolist() == [4.0, 4.0, 5.0, 5.0]
    assert resolve.load(params_path, [f"rl.rewards=[{{name: '{user_module}:score'}}]"]).rl.rewards[0].name == entry.name  # imported once


@pytest.mark.parametrize("attr, message", [
    ("nope", "rl.rewards.0.name: reward '{m}:nope': {m} has no attribute 'nope'"),
    ("NOT_A_FUNCTION", "rl.rewards.0.name: reward '{m}:NOT_A_FUNCTION': NOT_A_FUNCTION is not a function (got int)"),
])
def test_a_missing_or_uncallable_attribute_is_one_line(params_path, user_module, attr, message):
    with pytest.raises(UserError) as info:
        load_with_rewards(params_path, f"{user_module}:{attr}")
    assert str(info.value) == message.format(m=user_module)


def test_a_missing_or_failing_module_is_one_line(params_path, tmp_path, registries_restored, monkeypatch):
    (tmp_path / "broken_rewards_mod.py").write_text("import nonexistent_dependency_xyz\n")
    (tmp_path / "raising_rewards_mod.py").write_text("raise RuntimeError('bad settings')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"^rl.rewards.0.name: reward 'no_such_pkg.rewards:score': no module named 'no_such_pkg'$"):
        load_with_rewards(params_path, "no_such_pkg.rewards:score")
    with pytest.raises(UserError, match=r"no module named 'nonexistent_dependency_xyz'$"):
        load_with_rewards(params_path, "broken_rewards_mod:score")
    with pytest.raises(UserError, match=r"importing raising_rewards_mod failed: RuntimeError: bad settings$"):
        load_with_rewards(params_path, "raising_rewards_mod:score")
    with pytest.raises(UserError, match=r"unknown reward 'correctnes'; did you mean 'correctness'.*module:attr"):
        load_with_rewards(params_path, "correctnes")


@pytest.mark.parametrize("attr, message", [
    ("boom", "reward {m}:boom raised ValueError: cannot score"),
    ("too_few", "reward {m}:too_few returned 1 scores for 2 completions"),
    ("words", "reward {m}:words: score 0 is a str ('high'), expected a number or None"),
])
def test_a_reward_that_fails_on_a_batch_stops_the_run_with_one_line(params_path, user_module, attr, message):
    cfg = load_with_rewards(params_path, f"{user_module}:{attr}")
    with pytest.raises(UserError) as info:
        reward_matrix(cfg.rl.rewards, None, [Example("q", "a", "a")] * 2, ["a", "b"], [True, True])
    assert str(info.value) == message.format(m=user_module)


def test_metadata_holds_every_extra_column_per_completion():
    rows = [SimpleNamespace(prompt="p", completion="c", answer="1", metadata={"level": 3}),
            SimpleNamespace(prompt="p", completion="c", answer="2", metadata={"topic": "algebra"})]
    assert example_columns(rows) == {"answer": ["1", "2"], "level": [3, None], "topic": [None, "algebra"]}
    assert example_columns([Example("p", "c", "7")]) == {"answer": ["7"]}


def test_the_launchers_schema_admits_registered_names_and_module_attr_paths(params_path):
    from posttrain.orchestration.schema import param_specs

    schema = param_specs(params_path)["rl.rewards"]["schema"]
    jsonschema.validate([{"name": "correctness"}, {"name": "my_pkg.rewards:score", "weight": 0.5}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "no_such_reward"}], schema)


# --- plugins ----------------------------------------------------------------------------------------------

PLUGIN_MODULE = '''
import torch
from posttrain.rewards import rewards

def register(registries):
    length = lambda task, examples, completions, finished: torch.tensor([float(len(c)) for c in completions])
    registries["rewards"].register("plugin_length")(length)
    registries["advantages"].register("plugin_constant", needs=())(lambda batch, cfg: torch.full((batch.size,), 0.5))

@rewards.register("plugin_by_import")
def by_import(task, examples, completions, finished):
    """Registered when the module is imported."""
    return torch.zeros(len(completions))

def fails(registries):
    raise KeyError("no such registry")

def clashes(registries):
    registries["rewards"].register("correctness")(lambda *a: None)

def brings_a_registry(registries):
    from posttrain.registry import Registry

    registries["greetings"] = Registry("greeting")
    registries["greetings"].register("hello")(str)
'''


def plugin_points(tmp_path, monkeypatch, *specs: tuple[str, str]) -> list[EntryPoint]:
    name = f"plugin_mod_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(PLUGIN_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return [EntryPoint(point, value.format(m=name), "posttrain.plugins") for point, value in specs]


def test_a_plugin_function_and_a_plugin_module_register_their_parts_with_a_source(tmp_path, monkeypatch, registries_restored):
    registries = {"rewards": rewards, "advantages": advantages}
    register_plugins(registries, plugin_points(tmp_path, monkeypatch, ("demo", "{m}:register"), ("by_module", "{m}")))
    assert rewards.entry("plugin_length").meta == {"source": "plugin demo"}
    assert advantages.entry("plugin_constant").meta == {"needs": (), "source": "plugin demo"}
    assert rewards.entry("plugin_by_import").meta == {"source": "plugin by_module"}  # entry points load sorted by name
    assert rewards.get("plugin_length")(None, [], ["ab", "c"], [True, True]).tolist() == [2.0, 1.0]


def test_a_plugin_may_bring_a_registry_of_its_own(tmp_path, monkeypatch, registries_restored):
    registries = {"rewards": rewards}
    register_plugins(registries, plugin_points(tmp_path, monkeypatch, ("own", "{m}:brings_a_registry")))
    assert registries["greetings"].entry("hello").meta == {"source": "plugin own"}  # every entry of it is the plugin's


@pytest.mark.parametrize("value, message", [
    ("{m}:fails", r"^plugin broken \({m}:fails\) failed: KeyError: 'no such registry'$"),
    ("{m}:clashes", r"^plugin broken \({m}:clashes\) failed: ValueError: reward 'correctness' is already registered$"),
    ("{m}:missing", r"^plugin broken \({m}:missing\) failed: AttributeError: .*missing"),
])
def test_a_plugin_that_fails_stops_with_one_line_naming_it(tmp_path, monkeypatch, registries_restored, value, message):
    [point] = plugin_points(tmp_path, monkeypatch, ("broken", value))
    with pytest.raises(UserError, match=message.format(m=point.value.partition(":")[0])):
        register_plugins({"rewards": rewards, "advantages": advantages}, [point])


def test_posttrain_registry_marks_plugin_entries(registries_restored):
    from helpers import posttrain_in_process

    rewards.register("from_a_plugin", source="plugin demo (demo-plugin 0.1)")(lambda *a: None)
    lines = posttrain_in_process("registry").splitlines()
    line = next(line for line in lines if line.startswith("rewards: "))
    assert "from_a_plugin [plugin demo (demo-plugin 0.1)]" in line and "correctness," in line
