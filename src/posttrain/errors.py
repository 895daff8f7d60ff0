"""The one exception type for mistakes a user can make (bad params, bad data, missing files).

The CLI turns a `UserError` into one line on stderr and exit code 2; anything else is a bug and keeps
its traceback.
"""


class UserError(Exception):
    """A problem in what the user asked for, reported as one line."""

    exit_code = 2


class TrackingIncomplete(UserError):
    """The stage's output is complete and in place, but MLflow did not take all of its log (`posttrain relog`
    sends the rest). Its own exit code, so a launcher can tell it from a stage that produced nothing."""

    exit_code = 3


class Terminated(BaseException):
    """SIGTERM (a scheduler or `kill`), raised in the main thread by the CLI's handler so the stage unwinds: its
    MLflow run ends KILLED and a resumable stage keeps its checkpoints. A BaseException, like KeyboardInterrupt,
    so no `except Exception` of a stage swallows it."""

    exit_code = 143  # 128 + SIGTERM, what a shell reports for a process SIGTERM ended


def assert_no_grad(**tensors) -> None:
    """Teacher, reference, base and critic tensors are constants to the policy: fail loudly if one carries gradient."""
    for name, tensor in tensors.items():
        if tensor is not None and tensor.requires_grad:
            raise AssertionError(f"{name} must not carry gradient (teacher, base, reference and critic tensors are constants)")
