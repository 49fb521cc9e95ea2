"""Crash injection at named protocol steps (the job's `faults.crash_at`), for the crash tests
and for drills against a staging cluster.

A service calls `install` once at start with its own name (`coordinator` or its worker id);
the protocol code calls `reach(step)` between two durable actions. When 'NAME:STEP' is in
`faults.crash_at` and that crash has not happened yet, the process writes a marker file and
kills itself with SIGKILL: nothing is flushed, closed or committed, as in a real crash. The
marker (under `<worker.state_dir>/faults/`, the disk a restarted process gets back) makes
each crash happen once, so the restarted process goes on past the step; tests read it to
prove the crash really ran.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

import structlog

from streamjoin.settings import JobSettings

log = structlog.get_logger("streamjoin.faults")


@dataclass(frozen=True)
class _Armed:
    process: str
    steps: frozenset[str]
    marker_dir: Path


_armed: _Armed | None = None


def marker_dir(job: JobSettings) -> Path:
    """Where crash markers are written: one file 'PROCESS:STEP' per crash that happened."""
    return Path(job.worker.state_dir) / "faults"


def install(job: JobSettings, process: str) -> None:
    """Arm this process's crash steps from `job.faults.crash_at`; `process` is `coordinator` or
    the worker's id. Without entries for `process`, `reach` does nothing."""
    global _armed
    steps = frozenset(step for entry in job.faults.crash_at
                      for name, _, step in [entry.partition(":")] if name == process)
    _armed = _Armed(process, steps, marker_dir(job)) if steps else None


def reach(step: str) -> None:
    """The process has reached `step`: crash here if armed for it and not crashed here before."""
    if _armed is None or step not in _armed.steps:
        return
    marker = _armed.marker_dir / f"{_armed.process}:{step}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(os.getpid()))
    log.warning("injected crash", process=_armed.process, step=step)
    os.kill(os.getpid(), signal.SIGKILL)
