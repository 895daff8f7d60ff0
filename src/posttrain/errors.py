"""The one exception type for mistakes a user can make (bad params, bad data, missing files).

The CLI turns a `UserError` into one line on stderr and exit code 2; anything else is a bug and keeps
its traceback.
"""


class UserError(Exception):
    """A problem in what the user asked for, reported as one line."""

    exit_code = 2
