"""Stopping a service when asked: SIGTERM (what Kubernetes sends) or SIGINT (Ctrl-C).

A service loop looks at `StopFlag.set` between cycles and ends cleanly: it finishes
or drops the cycle in hand (both are safe: recovery replays what was decided and
never checkpointed), closes its clients and exits 0. Waits that may last for good
(a broker that is gone, recovery retrying against it) are marked `interruptible`:
a signal there raises `Stopped` at once instead of waiting for the loop to look.
A grace timer ends the process (code 0) if the clean path itself hangs, e.g. in a
librdkafka call that cannot be interrupted, before Kubernetes' SIGKILL would.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Any, Callable, Iterator

import structlog

from streamjoin.services.io.transactions import hard_exit

log = structlog.get_logger("streamjoin.shutdown")

GRACE_S = 20.0  # below the 30 s Kubernetes gives a pod by default between SIGTERM and SIGKILL
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(BaseException):
    """Raised out of an interruptible wait when a stop was asked for. A BaseException, like
    KeyboardInterrupt, so the `except Exception` of a retry loop does not swallow it."""


class StopFlag:
    """Set by SIGTERM/SIGINT once `install`ed (from the main thread).

    `grace_s`: how long after the first signal the process may take to stop cleanly
    before the grace timer ends it with `hard_exit(0)`."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.set = False
        self.grace_s = grace_s
        self._interruptible = 0

    def install(self) -> None:
        for sig in SIGNALS:
            signal.signal(sig, self._on_signal)

    def request(self) -> None:
        """Ask for a stop as a signal does (also from code: tests, a CLI)."""
        if not self.set:
            self.set = True
            timer = threading.Timer(self.grace_s, _out_of_grace, args=(self.grace_s,))
            timer.daemon = True
            timer.start()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("stop requested", signal=signal.Signals(signum).name)
        self.request()
        if self._interruptible:
            raise Stopped()

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """A stretch a signal may cut short with `Stopped` (raised at entry too when the
        stop came first). Only for code whose abandonment is a crash recovery handles."""
        if self.set:
            raise Stopped()
        self._interruptible += 1
        try:
            yield
        finally:
            self._interruptible -= 1


def _out_of_grace(grace_s: float) -> None:
    log.error("did not stop within the grace period; exiting now (recovery replays what was left)",
              grace_s=grace_s)
    hard_exit(0)


class _Deferral:
    """How deep the main thread is in `signals_deferred` stretches, and whether a signal came."""

    depth = 0
    pending = False


def raise_on_signals() -> None:
    """For one-shot commands (the broker, the demo): SIGTERM and SIGINT raise `Stopped`
    wherever the main thread is (but inside `signals_deferred`), so `with`/`finally` blocks
    take their children down."""
    def handler(signum: int, frame: FrameType | None) -> None:
        if _Deferral.depth:
            _Deferral.pending = True
            return
        raise Stopped()

    for sig in SIGNALS:
        signal.signal(sig, handler)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """A stretch `raise_on_signals` does not cut: a signal arriving inside raises `Stopped` at
    its end instead. For steps that must not be abandoned halfway, such as starting a child
    process and recording it (a `Stopped` raised inside `Popen`, after the fork, would leave a
    child its parent never stops)."""
    _Deferral.depth += 1
    try:
        yield
    finally:
        _Deferral.depth -= 1
    if not _Deferral.depth and _Deferral.pending:
        _Deferral.pending = False
        raise Stopped()


def started(stop_flag: StopFlag, steps: Callable[[], None], log: Any, event: str, **context: object) -> bool:
    """Run a service's start-up `steps` (waiting for the broker, restoring) so that SIGTERM or
    SIGINT cuts them short; False, logged as `event` with `context`, when one did."""
    try:
        with stop_flag.interruptible():
            steps()
    except Stopped:
        log.info(event, **context)
        return False
    return True
