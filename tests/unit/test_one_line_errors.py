"""A user error is one line on stderr: library warnings raised during the command (PyTorch's lr_scheduler order on
a skipped first step, ...) are held until the command ends and dropped with a user error (issue 38, item 5)."""

from __future__ import annotations

import sys
import warnings

import pytest

from helpers import micro_params, posttrain, posttrain_main
from posttrain.errors import UserError


@pytest.fixture
def command(monkeypatch):
    """`posttrain` whose app is replaced by `body` (no stage registry imported)."""
    import posttrain.cli as cli

    def use(body):  # a warning shown as Python shows it, on stderr (pytest records warnings instead)
        monkeypatch.setattr(warnings, "showwarning", lambda message, category, filename, lineno, file=None, line=None:
                            sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line)))
        monkeypatch.setattr(cli, "app", lambda standalone_mode: body())
        monkeypatch.setattr(cli, "_register_stage_commands", lambda: None)
        monkeypatch.setattr(cli, "_early_lock", lambda argv: __import__("contextlib").nullcontext())
    return use


def test_a_library_warning_before_a_user_error_is_dropped(command, monkeypatch, capsys):
    def body():
        warnings.warn("Detected call of `lr_scheduler.step()` before `optimizer.step()`", UserWarning, stacklevel=1)
        raise UserError("step 1: the loss was not finite")

    command(body)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code, out, err = posttrain_main(monkeypatch, capsys, "rl")
    assert code == 2 and err == "posttrain: error: step 1: the loss was not finite\n", err


def test_a_library_warning_of_a_run_that_succeeds_is_shown_at_its_end(command, monkeypatch, capsys):
    command(lambda: warnings.warn("something a library says", UserWarning, stacklevel=1))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code, _, err = posttrain_main(monkeypatch, capsys, "rl")
    assert code == 0 and "UserWarning: something a library says" in err, err


@pytest.mark.slow
def test_reward_weights_of_1e308_stop_with_exactly_one_stderr_line(tmp_path, monkeypatch, capsys):
    micro_params(tmp_path, tracking={"enabled": False})
    monkeypatch.chdir(tmp_path)
    for stage in ("data", "sft"):
        assert posttrain_main(monkeypatch, capsys, stage)[0] == 0
    result = posttrain("rl", "--set", "rl.rewards=[{name: correctness, weight: 1e308}, {name: format, weight: 1e308}]",
                       cwd=tmp_path, check=False)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("posttrain: error: step ") and "not finite" in lines[0], lines[0]
