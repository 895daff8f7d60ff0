"""`posttrain` for tests that count prompts across a kill under torchrun (tests/smoke/test_async_torchrun.py): the
async trainer appends the prompts of each update it trains, and at its end those still pooled or in flight and
every prompt the stream handed out, to $ASYNC_RECORD. With $ASYNC_KILL_AT=k the trainer SIGKILLs itself the moment
checkpoint k is on disk (no race with the end of a short run). Run it as `torchrun ... tests/async_record.py rl ...`."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from posttrain.cli import main
from posttrain.trainers import async_rl, loop
from posttrain.trainers.online_rl import PromptStream

RECORD = Path(os.environ["ASYNC_RECORD"])
samples_of, stop, save = async_rl.AsyncRollouts.samples_of, async_rl.AsyncRollouts.stop, loop.save_checkpoint


def write(row: dict) -> None:
    with RECORD.open("a") as f:
        f.write(json.dumps({"pid": os.getpid(), **row}) + "\n")


def trained(self, groups):
    out = samples_of(self, groups)
    write({"trained": [self.run.examples[i].prompt for i in out[2]]})
    return out


def stopped(self):
    left = [self.run.examples[j.example].prompt for j in self.pending.values()]
    left += [self.run.examples[p["example"]].prompt for p in self.payloads.values()]
    write({"left": left, "handed_out": [e.prompt for e in PromptStream(self.run.examples, self.run.seed).take(self.next_number)]})
    stop(self)


def save_then_die(directory, step, *rest, **kwargs):
    path = save(directory, step, *rest, **kwargs)
    if str(step) == os.environ.get("ASYNC_KILL_AT"):
        os.kill(os.getpid(), signal.SIGKILL)
    return path


async_rl.AsyncRollouts.samples_of, async_rl.AsyncRollouts.stop, loop.save_checkpoint = trained, stopped, save_then_die

if __name__ == "__main__":
    main()
