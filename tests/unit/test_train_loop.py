"""TrainLoop (trainers/loop.py): the guarded optimiser step skips and counts non-finite steps and stops past the
consecutive limit; checkpoints are fsynced before they are renamed into place, pruned to `keep`, written at the
last step only for a phase that asks, and restore falls back to an older checkpoint when the newest is unreadable."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch

from posttrain.errors import UserError
from posttrain.trainers import checkpoint
from posttrain.trainers.loop import TrainLoop


def model_and_optimizer(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def step(loop: TrainLoop, index: int, model, optimizer, scale: float = 1.0) -> float:
    """One update on a fixed batch whose loss is multiplied by `scale` (NaN or inf: a diverged step)."""
    loss = model(torch.ones(4, 3)).pow(2).mean() * scale
    loss.backward()
    return loop.optimizer_step(index, loss, list(model.parameters()), optimizer, max_grad_norm=1.0)


def test_a_non_finite_loss_or_gradient_skips_the_update_and_is_counted():
    model, optimizer = model_and_optimizer()
    loop = TrainLoop(max_nonfinite_steps=5)
    step(loop, 1, model, optimizer)  # a finite step first: the optimiser has moments to keep
    weights, moments = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    assert math.isnan(step(loop, 2, model, optimizer, float("nan")))
    model.weight.sum().backward()
    model.weight.grad[0, 0] = float("inf")  # a finite loss with an infinite gradient
    assert math.isinf(loop.optimizer_step(3, 1.0, list(model.parameters()), optimizer, 1.0))
    for name, value in model.state_dict().items():
        assert torch.equal(value, weights[name]), f"{name} moved on a skipped step"
    after = optimizer.state_dict()
    assert after["state"].keys() == moments["state"].keys()
    for index, state in moments["state"].items():
        assert all(torch.equal(state[k], after["state"][index][k]) for k in state), "the optimiser's moments moved"
    assert all(p.grad is None for p in model.parameters())  # freed either way
    assert (loop.nonfinite_steps, loop.consecutive) == (2, 2)
    step(loop, 4, model, optimizer)
    assert (loop.nonfinite_steps, loop.consecutive) == (2, 0) and not torch.equal(model.weight, weights["weight"])
    assert loop.metrics() == {"nonfinite_steps": 2.0}


def test_more_consecutive_non_finite_steps_than_allowed_stop_the_run_in_one_line():
    model, optimizer = model_and_optimizer()
    loop = TrainLoop(max_nonfinite_steps=2, section="sft")
    step(loop, 1, model, optimizer, float("inf"))
    step(loop, 2, model, optimizer)  # a finite step in between restarts the count
    step(loop, 3, model, optimizer, float("nan"))
    step(loop, 4, model, optimizer, float("nan"))
    with pytest.raises(UserError) as stopped:
        step(loop, 5, model, optimizer, float("nan"))
    message = str(stopped.value)
    assert "\n" not in message and message.startswith("step 5: ") and "not finite on 3 consecutive steps" in message
    assert "training.max_nonfinite_steps is 2" in message and "no checkpoint was written (set sft.checkpoint_every)" in message
    assert loop.nonfinite_steps == 4


def test_a_run_diverging_before_its_first_checkpoint_says_so_instead_of_asking_for_checkpoint_every(tmp_path):
    """Issue 38 item 4: with checkpoint_every set, the hint to set it was false; the line names both steps."""
    model, optimizer = model_and_optimizer()
    loop = TrainLoop(tmp_path, "h", every=10, max_nonfinite_steps=0, section="sft")
    for index in range(1, 8):
        step(loop, index, model, optimizer)
        loop.checkpoint(index, 20, model, {"optimizer": optimizer})
    with pytest.raises(UserError) as stopped:
        step(loop, 8, model, optimizer, float("nan"))
    message = str(stopped.value)
    assert "\n" not in message and "set sft.checkpoint_every" not in message
    assert "the run diverged at step 8, before the first checkpoint at step 10" in message
    assert "sft.checkpoint_every is 10" in message


def test_max_nonfinite_steps_zero_stops_at_the_first_and_names_the_last_checkpoint(tmp_path):
    model, optimizer = model_and_optimizer()
    loop = TrainLoop(tmp_path, "h", every=1, max_nonfinite_steps=0)
    step(loop, 1, model, optimizer)
    loop.checkpoint(1, 10, model, {"optimizer": optimizer})
    with pytest.raises(UserError, match=f"step 2: .*not finite on 1 consecutive steps.*kept: {tmp_path / 'step-000001'}$"):
        step(loop, 2, model, optimizer, float("nan"))


def test_a_checkpoint_is_fsynced_before_it_is_renamed_into_place_and_pruned_to_keep(tmp_path, monkeypatch):
    synced = []
    real = checkpoint._fsync
    monkeypatch.setattr(checkpoint, "_fsync", lambda path: (synced.append((path, (tmp_path / "step-000002").exists())), real(path)))
    model, optimizer = model_and_optimizer()
    loop = TrainLoop(tmp_path, "h", every=2, keep=2)
    for index in range(1, 9):
        step(loop, index, model, optimizer)
        loop.checkpoint(index, 8, model, {"optimizer": optimizer})
        if index == 2:
            tmp = tmp_path / ".step-000002.tmp"
            # the files and their directory are durable before the rename; the parent (the rename itself) after it
            assert synced == [(tmp / "model.safetensors", False), (tmp / "trainer.pt", False), (tmp / "manifest.json", False), (tmp, False),
                              (tmp_path, True)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000004", "step-000006"]  # none at the last step; no .tmp left
    assert sorted(p.name for p in (tmp_path / "step-000006").iterdir()) == ["manifest.json", "model.safetensors", "trainer.pt"]
    assert loop.last_checkpoint == tmp_path / "step-000006"


def test_only_a_phase_that_saves_its_last_step_checkpoints_it_and_phases_have_their_own_folders(tmp_path):
    model, optimizer = model_and_optimizer()
    stage = TrainLoop(tmp_path / "checkpoints", "h", every=3)
    first, second = stage.phase(save_last=True), stage.phase("rl")
    for loop in (first, second):
        for index in range(1, 5):
            loop.checkpoint(index, 4, model, {"optimizer": optimizer})
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == ["step-000003", "step-000004"]
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "rl").glob("step-*")) == ["step-000003"]
    assert TrainLoop().phase("rl").checkpoint_dir is None  # no checkpoints stays no checkpoints


def test_restore_puts_back_the_weights_parts_values_and_counts(tmp_path, capsys):
    model, optimizer = model_and_optimizer()
    generator, pairs = torch.Generator().manual_seed(1), random.Random(2)
    parts = {"optimizer": optimizer, "generator": generator, "pairs": pairs}
    loop = TrainLoop(tmp_path, "h", every=1, max_nonfinite_steps=5)
    step(loop, 1, model, optimizer, float("nan"))
    step(loop, 2, model, optimizer)
    loop.checkpoint(2, 10, model, parts, {"history": [{"loss": 1.5}], "state": {"alpha": 0.25, "variance": math.inf}})
    expected = (copy.deepcopy(model.state_dict()), torch.rand(3, generator=generator), pairs.random())

    fresh, fresh_optimizer = model_and_optimizer(seed=7)
    fresh_generator, fresh_pairs = torch.Generator().manual_seed(9), random.Random(9)
    again = TrainLoop(tmp_path, "h", every=1, resume=True, section="rl")
    start, values = again.restore(fresh, {"optimizer": fresh_optimizer, "generator": fresh_generator, "pairs": fresh_pairs})
    assert capsys.readouterr().err == f"posttrain: resumed rl at step 2 from {tmp_path / 'step-000002'}\n"  # what a retry's log shows
    assert start == 2 and values == {"history": [{"loss": 1.5}], "state": {"alpha": 0.25, "variance": math.inf}}
    assert (again.nonfinite_steps, again.consecutive) == (1, 0) and again.last_checkpoint == tmp_path / "step-000002"
    assert all(torch.equal(v, expected[0][k]) for k, v in fresh.state_dict().items())
    assert torch.equal(torch.rand(3, generator=fresh_generator), expected[1]) and fresh_pairs.random() == expected[2]
    assert fresh_optimizer.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]
    assert TrainLoop(tmp_path, "h", every=1, resume=False).restore(fresh, {}) == (0, {})  # without --resume: a fresh start
    assert capsys.readouterr().err == ""


def two_checkpoints(tmp_path):
    """Checkpoints at steps 1 and 2 of a short run in `tmp_path`; the weights at step 1."""
    model, optimizer = model_and_optimizer()
    loop = TrainLoop(tmp_path, "h", every=1)
    for index in (1, 2):
        step(loop, index, model, optimizer)
        loop.checkpoint(index, 10, model, {"optimizer": optimizer})
        if index == 1:
            at_one = copy.deepcopy(model.state_dict())
    return at_one


@pytest.mark.parametrize("damaged", ["model.safetensors", "trainer.pt"])
def test_restore_falls_back_to_the_older_checkpoint_when_the_newest_is_truncated(tmp_path, capsys, damaged):
    at_one = two_checkpoints(tmp_path)
    newest = tmp_path / "step-000002" / damaged
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])

    fresh, fresh_optimizer = model_and_optimizer(seed=3)
    start, _ = TrainLoop(tmp_path, "h", every=1, resume=True).restore(fresh, {"optimizer": fresh_optimizer})
    assert start == 1 and all(torch.equal(v, at_one[k]) for k, v in fresh.state_dict().items())
    assert "step-000002 cannot be read" in capsys.readouterr().err

    older = tmp_path / "step-000001" / damaged
    older.write_bytes(older.read_bytes()[:10])
    with pytest.raises(UserError) as refused:
        TrainLoop(tmp_path, "h", every=1, resume=True).restore(fresh, {"optimizer": fresh_optimizer})
    assert "\n" not in str(refused.value) and f"no checkpoint in {tmp_path} can be read" in str(refused.value)


@pytest.mark.parametrize("damaged", ["model.safetensors", "trainer.pt"])
def test_a_flipped_byte_in_the_newest_checkpoint_falls_back_to_the_older_one(tmp_path, capsys, damaged):
    """Issue 38, item 7: a flipped bit inside the tensor data still parses; the manifest's sha256 refuses it, and the
    loader falls back as for a truncated file. The byte is flipped in the last quarter of the file (the tensor data of
    a safetensors file, past its header)."""
    at_one = two_checkpoints(tmp_path)
    newest = tmp_path / "step-000002" / damaged
    data = bytearray(newest.read_bytes())
    data[len(data) * 3 // 4] ^= 0x01
    newest.write_bytes(bytes(data))

    fresh, fresh_optimizer = model_and_optimizer(seed=3)
    start, _ = TrainLoop(tmp_path, "h", every=1, resume=True).restore(fresh, {"optimizer": fresh_optimizer})
    assert start == 1 and all(torch.equal(v, at_one[k]) for k, v in fresh.state_dict().items())
    err = capsys.readouterr().err
    assert "step-000002 cannot be read" in err and f"{damaged} does not match its checksum" in err, err


def test_a_checkpoint_without_a_manifest_still_loads(tmp_path):
    """Checkpoints written before manifests existed are read as they are."""
    model, optimizer = model_and_optimizer()
    loop = TrainLoop(tmp_path, "h", every=1)
    step(loop, 1, model, optimizer)
    loop.checkpoint(1, 10, model, {"optimizer": optimizer})
    (tmp_path / "step-000001" / "manifest.json").unlink()
    fresh, fresh_optimizer = model_and_optimizer(seed=3)
    assert TrainLoop(tmp_path, "h", every=1, resume=True).restore(fresh, {"optimizer": fresh_optimizer})[0] == 1
