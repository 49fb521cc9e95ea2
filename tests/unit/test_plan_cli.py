"""`streamjoin plan ring`: calibration on this machine, then the PSP paper's cost model per ring size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamjoin.services import broker as embedded
from streamjoin.services.io import kafka
from streamjoin.services.coordinator import ring_plan
from streamjoin.cli import app
from streamjoin.job_files import default_job_file
from streamjoin.settings import load

runner = CliRunner()
JOBS = Path(default_job_file()).parent


@pytest.fixture(autouse=True)
def _no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMJOIN_BOOTSTRAP", raising=False)


def test_plan_ring_images_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMJOIN_WORKLOAD__PIXELS", "200")  # small images: calibration stays fast
    result = runner.invoke(app, ["plan", "ring", str(JOBS / "images.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    max_nodes = load(JOBS / "images.yaml").ring.max_nodes
    assert [r["N"] for r in plan["rows"]] == list(range(1, max_nodes + 1))
    assert 1 <= plan["best_N"] <= max_nodes and 1 <= plan["best_N_closed_form"] <= max_nodes
    m = plan["measurements"]
    assert all(m[k] > 0 for k in ("T_j", "T_p", "T_i", "T_s", "T_n", "tuple_bytes"))
    assert m["T_n_source"] == "default"
    # a ~ b and b ~ c share images of one scene in 10: every probing step passes about 0.1
    assert all(0.03 < s < 0.3 for sels in m["selectivities"].values() for s in sels)
    # c is related to b only, so c probes b first (no cross product with a)
    assert plan["join_order"]["c"] == ["b", "a"]
    assert all(r["service_rate"] > 0 and r["latency_s"] > 0 for r in plan["rows"])


def test_plan_ring_table(monkeypatch: pytest.MonkeyPatch) -> None:
    result = runner.invoke(app, ["plan", "ring", str(JOBS / "band3.yaml")])
    assert result.exit_code == 0, result.output
    assert "best" in result.stdout and "T_n_source" not in result.stdout and "(default)" in result.stdout


def test_plan_ring_on_a_hash_mode_job_exits_2() -> None:
    result = runner.invoke(app, ["plan", "ring", str(JOBS / "equijoin.yaml")])
    assert result.exit_code == 2
    assert "join.mode" in result.output


def test_choose_ring_size_respects_max_nodes() -> None:
    job = load(JOBS / "band3.yaml", ring={"nodes": "auto", "max_nodes": 2})
    m = ring_plan.calibrate(job, None, sample_rows=128, step_budget_s=0.05)
    assert 1 <= ring_plan.choose_ring_size(job, m) <= 2
    assert len(m.selectivities) == 3 and m.orders[0] == (1, 2)  # r relates to s only


def test_explicit_join_order_is_kept() -> None:
    job = load(JOBS / "band3.yaml", join={"order": {"t": ["r", "s"]}})
    m = ring_plan.calibrate(job, None, sample_rows=128, step_budget_s=0.05)
    assert m.orders[2] == (0, 1)
    assert m.selectivities[2][0] == 1.0  # t x r: no term relates them, a cross product


@pytest.mark.integration
def test_hop_latency_is_measured_on_a_broker(tmp_path: Path) -> None:
    with embedded.start(log_path=tmp_path / "broker.log") as b:
        job = load(JOBS / "band3.yaml", bootstrap=b.bootstrap)
        plan = ring_plan.plan_ring(job, kafka.Cluster(b.bootstrap))
        assert plan["measurements"]["T_n_source"] == "measured"
        assert 0 < plan["measurements"]["T_n"] < 1.0
