"""README command 1 in small: the demo end to end, real Spark `sources`
feeding real workers on the embedded broker, real Spark `verify` judging.
Run as a command, so that whatever the JVM prints would reach its terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.spark_output import named_log, noise, spark_lines

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_demo_is_verified_exact_and_quiet(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "STREAMJOIN_BOOTSTRAP"}
    # The demo job's domain at a tenth of the rate: fewer matches, so widen the window to keep output.
    env["STREAMJOIN_WORKLOAD__DOMAIN"] = "65536"
    command = [sys.executable, "-c", "from streamjoin.cli import app; app()", "demo", "--seconds", "12",
               "--workers", "2", "--rate", "300", "--report", str(report)]
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert noise(run.stdout + run.stderr) == [], "Spark's and Python's chatter belongs in the Spark log"
    data = json.loads(report.read_text())
    assert data["logs"]["spark"] == named_log(run.stderr) == json.loads(run.stdout)["logs"]["spark"]
    assert spark_lines(Path(data["logs"]["spark"]).read_text()), "Spark's lines are in the log file instead"
    assert data["verified"] is True
    assert data["missing"] == data["extra"] == data["duplicates"] == 0
    assert data["inputs"]["total"] > 5000
    assert data["results"] == data["expected"] > 1000
    assert 0 < data["delay_ms"]["p50"] <= data["delay_ms"]["p99"]
    assert report.with_suffix(".png").stat().st_size > 10_000
