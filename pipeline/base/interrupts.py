"""Ctrl-C, SIGTERM and SIGHUP that leave an honest store behind.

A signal becomes an `Interrupted` exception so that whoever opened a run can mark it KILLED. It
is never raised inside a tracking call: an exception thrown into the middle of a database write
or a connection-pool checkout can leave a lock held and hang the clean-up that follows. A signal
arriving there is held until the call returns. A second signal exits at once, after running the
last-resort actions of every run still open (one quick attempt to mark each KILLED), newest first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP during a sweep; exit code 128 + the signal number (130 for Ctrl-C,
    143 for SIGTERM, 129 for SIGHUP: a closed terminal or a dropped ssh connection)."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


# SIGHUP (a terminal closed, an ssh connection dropped) ends a sweep as SIGTERM does.
HANDLED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))

_state = threading.local()
_received: list[int] = []  # every signal a handled() block turned into Interrupted, in order
_last_resorts: list = []  # what a second signal does before exiting, newest last


@contextlib.contextmanager
def last_resort(action):
    """While the block runs, a second signal calls `action` (e.g. mark this run KILLED) before exiting."""
    _last_resorts.append(action)
    try:
        yield
    finally:
        _last_resorts.remove(action)


def _depth() -> int:
    return getattr(_state, "depth", 0)


@contextlib.contextmanager
def critical():
    """A section a signal must not interrupt (tracking calls): the signal is raised after it."""
    _state.depth = _depth() + 1
    try:
        yield
    finally:
        _state.depth -= 1
    held = getattr(_state, "held", None)
    if held is not None and _depth() == 0:
        _state.held = None
        raise Interrupted(held)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Turn SIGINT/SIGTERM/SIGHUP into Interrupted for the duration; only the main thread can do this."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def handler(signum, frame):
        if received:
            for action in reversed(_last_resorts):
                action()
            os._exit(128 + signum)
        received.append(signum)
        _received.append(signum)
        if _depth() > 0:
            _state.held = signum
            return
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in HANDLED}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _state.held = None


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """The exit code of the signal that stopped the work: the Interrupted's own, else (a library that
    caught it and raised a plain KeyboardInterrupt in its place: Ray's ray.wait) the last signal a
    handled() block received; 130, Ctrl-C's, where none did."""
    if isinstance(interrupt, Interrupted):
        return interrupt.exit_code
    return 128 + (_received[-1] if _received else signal.SIGINT)
