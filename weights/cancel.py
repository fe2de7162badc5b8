"""A cancelled command ends promptly and cleanly: SIGTERM (a CI cancel, ``timeout``), SIGINT
(Ctrl-C) and SIGHUP (a closed terminal) become ``Cancelled``, an exception that unwinds the
command's own cleanup (the port's processes killed, temporary files removed, a half-written
file deleted), then the command prints one line and exits 128 + the signal's number, as a
shell reports a process a signal ended.

``Cancelled`` is a ``BaseException``: no ``except Exception`` of the tool, nor a port's in the
same process, swallows it. After the first signal the others are only recorded, so the cleanup
itself is not interrupted by a second Ctrl-C.
"""

from __future__ import annotations

import contextlib
import signal
import threading

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))


class Cancelled(BaseException):
    """The command was told to stop by ``signum``."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextlib.contextmanager
def cancellable():
    """Inside: the signals raise ``Cancelled`` (once); outside, the handlers they had before. Off
    the main thread (where Python cannot set handlers) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum, frame):
        if fired:  # the cleanup of the first one is running: not interrupted again
            return
        fired.append(signum)
        raise Cancelled(signum)

    before = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def cancelled_line(command: str, e: BaseException) -> tuple[str, int]:
    """The one line a cancelled command prints, and its exit status (a ``KeyboardInterrupt`` that
    reached the top is SIGINT's)."""
    signum = e.signum if isinstance(e, Cancelled) else signal.SIGINT
    name = signal.Signals(signum).name
    return f"{command}: cancelled by {name}", 128 + signum
