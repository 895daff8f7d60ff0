"""Process-level helpers every layer may use: seeding the global RNGs, a progress bar on stderr, strict JSON, a
signal that raises an exception, and the fault-injection points of the crash tests."""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import sys
import threading
from collections.abc import Callable, Iterator

import numpy as np
import torch
from tqdm.auto import tqdm


_FAULT_HITS: dict[str, int] = {}


def fault_point(name: str) -> None:
    """A crash-test hook at a point of a durable write: with `POSTTRAIN_FAULT=<name>` (or `<name>@<n>`: the n-th time
    this point is reached) the process ends here at once, as `kill -9` would end it (`os._exit(137)`: no cleanup, no
    flush). Without the variable it costs one dict lookup."""
    wanted = os.environ.get("POSTTRAIN_FAULT")
    if not wanted:
        return
    point, _, nth = wanted.partition("@")
    if point != name:
        return
    _FAULT_HITS[name] = _FAULT_HITS.get(name, 0) + 1
    if _FAULT_HITS[name] == int(nth or 1):
        os._exit(137)


@contextlib.contextmanager
def signal_raises(signum: int, exception: Callable[[], BaseException]) -> Iterator[None]:
    """While inside, `signum` raises `exception()` in this process's main thread (outside the main thread, where no
    handler can be set, nothing changes). A forked child that inherits the handler dies of the signal as by default.

    Python runs a signal handler wherever the main thread is, also inside a `__del__` or a weakref callback that the
    garbage collector calls, and an exception raised there is printed and dropped ("Exception ignored in ..."): the
    process would go on as if no signal had come (a CI run's stage trained on past a SIGTERM that landed in a regex
    object's `__del__`). A dropped exception of this handler has a thread send the signal again, and the handler
    raises at a point the exception travels from; other unraisable exceptions reach the previous hook. Both the
    handler and the hook are restored on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner, raised = os.getpid(), []

    def handler(number, frame):
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raised.append(exception())
        raise raised[-1]

    unraisable = sys.unraisablehook
    again, closing = threading.Event(), threading.Event()

    def dropped(info) -> None:  # Python code run from here on would meet a signal sent now: a thread sends it
        if os.getpid() == owner and any(info.exc_value is e for e in raised):
            again.set()
        else:
            unraisable(info)

    def resend() -> None:
        while again.wait() and not closing.is_set():
            again.clear()
            os.kill(owner, signum)

    previous = signal.signal(signum, handler)
    sys.unraisablehook = dropped
    threading.Thread(target=resend, name=f"posttrain-{signal.Signals(signum).name.lower()}", daemon=True).start()
    try:
        yield
    finally:
        closing.set()
        again.set()
        signal.signal(signum, previous)
        sys.unraisablehook = unraisable


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def progress(total: int, desc: str, initial: int = 0) -> tqdm:
    return tqdm(total=total, initial=initial, desc=desc, file=sys.stderr, mininterval=1.0, dynamic_ncols=True, leave=False, disable=None)


def _finite_or_none(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def strict_json(payload, **kwargs) -> str:
    """`json.dumps` that strict parsers accept: a NaN or infinite float (a diverged loss, an undefined metric) is
    written as null instead of the bare `NaN` / `Infinity` Python would emit."""
    return json.dumps(_finite_or_none(payload), allow_nan=False, **kwargs)
