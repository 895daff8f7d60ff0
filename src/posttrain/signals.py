"""A signal that raises an exception in the main thread, also when it lands in a finaliser. Standard library only:
the CLI enters it before anything else (its early lock is timed from the process's start)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator


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
