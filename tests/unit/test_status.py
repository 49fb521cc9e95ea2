"""`streamjoin status` (services/coordinator/status.py, streamjoin/cli/fleet.py): each worker's row
carries its spill from its newest heartbeat (memory against the budget, bytes on disk,
generations, clean-up backlog), in the snapshot, the `--json` output and the table. The
placement and heartbeats are stubbed: no broker."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from streamjoin.cli import app
from streamjoin.schemas import control
from streamjoin.services.io import kafka
from streamjoin.services.coordinator import status
from streamjoin.settings import load

runner = CliRunner()


def _snapshot(monkeypatch: pytest.MonkeyPatch) -> dict:
    """A snapshot of two placed workers: w0 spilling, w1 placed but silent."""
    now_ms = int(time.time() * 1000)
    records = {0: control.Placement(group=0, worker="w0", epoch=3), 1: control.Placement(group=1, worker="w1", epoch=3)}
    beat = control.Heartbeat(worker="w0", wall_ms=now_ms, groups=[0], epoch=3, state_bytes=9_000_000,
                             memory_bytes=1_500_000, memory_budget=2_000_000, spilled_bytes=7_500_000,
                             generations=4, cleanup_backlog_bytes=3_000_000, spilled_groups=[0])
    monkeypatch.setattr(status.placing, "load_all", lambda job, cluster: (records, {}))
    monkeypatch.setattr(status, "latest_heartbeats", lambda job, cluster: {"w0": beat})
    return status.snapshot(load("streamjoin/jobs/equijoin.yaml"), kafka.Cluster("127.0.0.1:1"))


def test_the_snapshot_shows_each_workers_spill(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = {r["worker"]: r for r in _snapshot(monkeypatch)["workers"]}
    assert {k: rows["w0"][k] for k in ("memory_bytes", "memory_budget", "spilled_bytes", "spilled_groups",
                                       "generations", "cleanup_backlog_bytes")} == {
        "memory_bytes": 1_500_000, "memory_budget": 2_000_000, "spilled_bytes": 7_500_000, "spilled_groups": [0],
        "generations": 4, "cleanup_backlog_bytes": 3_000_000}
    silent = rows["w1"]  # no heartbeat: nothing reported, not zero
    assert silent["memory_bytes"] is silent["spilled_bytes"] is silent["generations"] is None
    assert silent["spilled_groups"] == []


def test_status_json_and_table_show_the_spill(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = _snapshot(monkeypatch)
    monkeypatch.setattr(status, "snapshot", lambda job, cluster: snap)
    as_json = runner.invoke(app, ["status", "--json", "--bootstrap", "127.0.0.1:1"])
    assert as_json.exit_code == 0, as_json.output
    w0 = {r["worker"]: r for r in json.loads(as_json.output)["workers"]}["w0"]
    assert (w0["memory_bytes"], w0["memory_budget"], w0["generations"]) == (1_500_000, 2_000_000, 4)
    monkeypatch.setenv("COLUMNS", "250")  # one line per worker
    table = runner.invoke(app, ["status", "--bootstrap", "127.0.0.1:1"])
    assert table.exit_code == 0, table.output
    for header in ("memory MB (in/budget)", "spilled MB", "generations", "clean-up MB"):
        assert header in table.output
    (w0_line,) = [line for line in table.output.splitlines() if " w0 " in line]
    cells = [c.strip() for c in w0_line.split("│")]
    assert cells[-5:-1] == ["1.5/2.0", "7.5", "4", "3.0"]
    (w1_line,) = [line for line in table.output.splitlines() if " w1 " in line]
    assert [c.strip() for c in w1_line.split("│")][-5:-1] == ["-", "-", "-", "-"]
