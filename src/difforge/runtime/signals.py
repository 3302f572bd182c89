"""Turn termination signals into exceptions, so every ``finally`` and ``with`` block cleans up.

Python raises :class:`KeyboardInterrupt` for SIGINT, but SIGTERM (``kill``, ``timeout``, a job
scheduler, ``docker stop``) and SIGHUP (the terminal closed) end the process at once by default:
no ``finally`` runs, so a half-written ``.part`` file or report folder stays on disk.  The CLI
wraps every command in :func:`signals_raise` to give them the same exception path as Ctrl-C.
:func:`deferred_signals` holds signals back for the few statements that must not be cut in two
(creating a temp file and remembering its name, moving a finished report into place).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

#: Signals that mean "stop now" and end the process by default (SIGHUP does not exist on Windows).
TERMINATING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
#: Everything :func:`deferred_signals` holds back: the terminating signals and Ctrl-C.
INTERRUPTING = (signal.SIGINT, *TERMINATING)


class Terminated(KeyboardInterrupt):
    """A terminating signal arrived; a KeyboardInterrupt so code that handles Ctrl-C handles it too.

    ``exit_code`` is the shell convention 128 + signal number (143 for SIGTERM, 129 for SIGHUP).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum


def _in_main_thread() -> bool:
    """Only the main thread may install signal handlers (elsewhere signal.signal raises ValueError)."""
    return threading.current_thread() is threading.main_thread()


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    # A second signal while the first unwinds takes the default action (ends the process now), so a
    # stuck clean-up can still be stopped without SIGKILL.
    signal.signal(signum, signal.SIG_DFL)
    raise Terminated(signum)


@contextmanager
def signals_raise() -> Iterator[None]:
    """Within the block SIGTERM/SIGHUP raise :class:`Terminated`; the previous handlers come back after.

    A signal that is ignored when the block starts (``nohup`` ignores SIGHUP) stays ignored.
    """
    if not _in_main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    for signum in TERMINATING:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, _raise_terminated)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back for a short critical section, then deliver the first one.

    The Python-level handlers are swapped for one that only notes the signal (blocking the signal
    mask would not do: torch's worker threads would still take it and wake the main thread), and the
    noted signal is re-raised once the section is over, reaching whatever handler was there before.
    """
    if not _in_main_thread():
        yield
        return
    pending: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    previous: dict[int, Any] = {}
    for signum in INTERRUPTING:
        handler = signal.getsignal(signum)
        if handler is not signal.SIG_IGN and handler is not None:
            previous[signum] = signal.signal(signum, note)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pending:
            signal.raise_signal(pending[0])
