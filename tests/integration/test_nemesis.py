"""The nemesis's short seeded form (tests/integration/nemesis.py): a left join on 3 workers
under a fault schedule drawn from a seed (kills, replacements, pauses past the heartbeat
timeout, a killed coordinator, a paused broker, live moves), fed live with far-late and
malformed records, exact against the reference with every bad record dead-lettered once.
NEMESIS_SEED picks another schedule; the long form runs many."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.nemesis import run_one

pytestmark = pytest.mark.integration


def test_a_left_join_survives_a_seeded_fault_schedule(tmp_path: Path) -> None:
    seed = int(os.environ.get("NEMESIS_SEED", "7"))
    out = run_one("hash-left", seed, seconds=16, faults=3, work=tmp_path)
    assert not out.error, (out.error, out.faults)
    assert out.result is not None and out.result.expected > 1000, out
    assert out.result.exact, (out.result, out.faults)
    assert out.dead_letter_ok, out.faults
    assert len(out.faults) == 3
    if {f.kind for f in out.faults} & {"kill", "replace", "pause"}:  # a worker's crash path ran
        assert out.recovered > 0, out.faults
