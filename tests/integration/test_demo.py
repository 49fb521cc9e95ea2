"""README command 1 in small: the demo end to end, real Spark `sources`
feeding real workers on the embedded broker, real Spark `verify` judging."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamjoin.cli import app

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_demo_is_verified_exact(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("STREAMJOIN_BOOTSTRAP", raising=False)
    report = tmp_path / "report.json"
    # The demo job's domain at a tenth of the rate: fewer matches, so widen the window to keep output.
    monkeypatch.setenv("STREAMJOIN_WORKLOAD__DOMAIN", "65536")
    result = CliRunner().invoke(app, ["demo", "--seconds", "12", "--workers", "2", "--rate", "300",
                                      "--report", str(report)])
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["verified"] is True
    assert data["missing"] == data["extra"] == data["duplicates"] == 0
    assert data["inputs"]["total"] > 5000
    assert data["results"] == data["expected"] > 1000
    assert 0 < data["delay_ms"]["p50"] <= data["delay_ms"]["p99"]
    assert report.with_suffix(".png").stat().st_size > 10_000
