"""`streamjoin bench window --quick`, as a user runs it: our live tumbling-window join checked by
Spark verify, the backlog replay, Spark's windowed stream-stream join judged against the
oracle's pairs, PyFlink reported as not run without its venv, ratios, JSON and plot. Behaviour
only: the figures themselves are for docs/benchmarks/window.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.bench_reports import (check_ours_and_oracle, check_peer_counts, check_ratio_machine_plot,
                                             run_quick)

pytestmark = [pytest.mark.bench, pytest.mark.spark, pytest.mark.integration]


def test_bench_window_quick_reports_our_exact_join_beside_spark_judged_by_the_oracle(tmp_path: Path) -> None:
    data, plot = run_quick("window", tmp_path)
    verdict = check_ours_and_oracle(data)
    assert verdict["dead_letter"]["count"] == 0  # Spark sources' disorder is within the lateness
    # A result's window ends after its newest member, by up to the window, then the lateness.
    wait, lateness = data["oracle"]["window_end_wait_ms"], data["parameters"]["allowed_lateness_ms"]
    assert lateness < wait["p50"] <= wait["p99"] <= data["parameters"]["window"]["tumbling_ms"] + lateness

    spark = data["peers"]["spark"]
    check_peer_counts(spark, verdict)
    assert spark["drained"] is True
    assert spark["exact"] is True, {k: spark[k] for k in ("missing", "extra", "duplicates")}

    check_ratio_machine_plot(data, "spark", plot)
