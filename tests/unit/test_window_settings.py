"""Tumbling and hopping windows in the job file: one kind per window, a slide only with a hopping
window and within it, the same window on every stream, hash mode; a bad one exits 2 naming the
field. A good one loads, and its instance size counts as the stream's time window."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from streamjoin.cli import app
from streamjoin.settings import SettingsError, load
from tests.unit.test_settings_cli import _job, _ring_job

pytestmark = pytest.mark.unit

runner = CliRunner()
HOPPING = {"hopping_ms": 1000, "slide_ms": 500}


def _windows(*windows: dict):
    def mutate(data: dict) -> None:
        for stream, window in zip(data["streams"], windows):
            stream["window"] = window
    return mutate


@pytest.mark.parametrize("windows, field, words", [
    (({"tumbling_ms": 1000, "range_ms": 1000}, {"tumbling_ms": 1000}), "streams.0.window", "exactly one of"),
    (({"hopping_ms": 1000}, {"hopping_ms": 1000}), "streams.0.window", "hopping_ms needs a slide_ms"),
    (({"range_ms": 1000, "slide_ms": 500}, {"range_ms": 1000}), "streams.0.window", "slide_ms goes with hopping_ms"),
    ((HOPPING, {"hopping_ms": 1000, "slide_ms": 1500}), "streams.1.window", "must not exceed hopping_ms"),
    ((HOPPING, {"hopping_ms": 1000, "slide_ms": 0}), "streams.1.window.slide_ms", "greater than 0"),
    (({"tumbling_ms": -5}, {"tumbling_ms": 1000}), "streams.0.window.tumbling_ms", "greater than 0"),
    (({}, {"tumbling_ms": 1000}), "streams.0.window", "got none"),
    (({"hopping_ms": 10**6, "slide_ms": 999}, {"tumbling_ms": 1000}), "streams.0.window", "more than 1000 instances"),
    (({"tumbling_ms": 1 << 50}, {"tumbling_ms": 1000}), "streams.0.window.tumbling_ms", "less than or equal"),
    ((HOPPING, {"hopping_ms": 1000, "slide_ms": 250}), "streams.1.window", "the same window on every stream"),
    (({"tumbling_ms": 1000}, {"range_ms": 1000}), "streams.1.window", "the same window on every stream"),
])
def test_bad_instance_windows_exit_2_naming_the_field(tmp_path: Path, windows: tuple, field: str,
                                                      words: str) -> None:
    result = runner.invoke(app, ["topics", "check", "--job", str(_job(tmp_path, _windows(*windows))),
                                 "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert field in text and words in text, text


def test_a_ring_job_refuses_instance_windows_naming_join_mode(tmp_path: Path) -> None:
    path = _ring_job(tmp_path)
    data = yaml.safe_load(path.read_text())
    for stream in data["streams"]:
        stream["window"] = {"tumbling_ms": 1000}
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["worker", "--worker-id", "w0", "--job", str(path), "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert "join.mode ring: tumbling and hopping windows need join.mode hash" in " ".join(result.output.split())


@pytest.mark.parametrize("window, instance", [({"tumbling_ms": 700}, (700, 700)), (HOPPING, (1000, 500)),
                                              ({"hopping_ms": 900, "slide_ms": 900}, (900, 900))])
def test_a_window_join_loads_with_its_instances(tmp_path: Path, window: dict, instance: tuple) -> None:
    job = load(_job(tmp_path, _windows(window, window)))
    assert job.window_instance == instance and job.longest_time_window_ms == instance[0]
    assert all(s.window.span_ms == instance[0] and not s.window.is_rows for s in job.streams)


def test_sliding_jobs_have_no_instances(tmp_path: Path) -> None:
    job = load(_job(tmp_path, lambda d: None))
    assert job.window_instance is None


def test_retention_must_hold_an_instance_and_the_lateness(tmp_path: Path) -> None:
    def mutate(data: dict) -> None:
        _windows(HOPPING, HOPPING)(data)
        data.setdefault("join", {})["allowed_lateness_ms"] = 100
        data["topics"] = {"input": {"retention_ms": 1050}}
    with pytest.raises(SettingsError, match="longest time window plus join.allowed_lateness_ms \\(1100 ms\\)"):
        load(_job(tmp_path, mutate))
