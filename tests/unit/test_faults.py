"""faults.crash_at: the named process dies by SIGKILL at the step, once; other processes and
steps go on (services/faults.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from streamjoin.services.faults import marker_dir
from streamjoin.settings import load

STREAM = {"fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"], "window": {"range_ms": 10}}


def _job(tmp_path: Path):  # type: ignore[no-untyped-def]
    return load(None, streams=[{"name": "r", **STREAM}, {"name": "s", **STREAM}],
                worker={"state_dir": str(tmp_path)}, faults={"crash_at": ["w0:sender-committed"]})


def _reach(tmp_path: Path, process: str, step: str) -> int:
    """Run a process that arms `process`'s faults and reaches `step`; its exit code."""
    script = (f"from tests.unit.test_faults import _job; from pathlib import Path; "
              f"from streamjoin.services import faults; faults.install(_job(Path({str(tmp_path)!r})), {process!r}); "
              f"faults.reach({step!r})")
    return subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[2], timeout=60).returncode


def test_the_named_process_dies_at_its_step_once(tmp_path: Path) -> None:
    assert _reach(tmp_path, "w1", "sender-committed") == 0  # another worker
    assert _reach(tmp_path, "w0", "receiver-restored") == 0  # another step
    assert _reach(tmp_path, "w0", "sender-committed") == -signal.SIGKILL
    assert (marker_dir(_job(tmp_path)) / "w0:sender-committed").exists()
    assert _reach(tmp_path, "w0", "sender-committed") == 0  # restarted: it goes on past the step
