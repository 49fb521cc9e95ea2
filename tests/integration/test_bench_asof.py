"""`streamjoin bench asof --quick`, as a user runs it: our live as-of join checked by Spark
verify, the backlog replay, the Quix Streams peer judged against the oracle's pairs, PyFlink
reported as not run without its venv, ratios, JSON and plot. Behaviour only: the figures
themselves are for docs/benchmarks/asof.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.bench_reports import (check_ours_and_oracle, check_peer_counts, check_ratio_machine_plot,
                                             run_quick)

pytestmark = [pytest.mark.bench, pytest.mark.spark, pytest.mark.integration]

COUNTS = ("missing", "extra", "duplicates", "wrong_version", "missing_row_arrived_later")


def test_bench_asof_quick_reports_our_exact_join_beside_the_peers_judged_by_the_oracle(tmp_path: Path) -> None:
    # The Quix peer from the repository's .venv-quix.
    data, plot = run_quick("asof", tmp_path, unset=("STREAMJOIN_QUIX_PYTHON",))
    verdict = check_ours_and_oracle(data)
    assert verdict["dead_letter"]["count"] == 0  # rows arrive out of order, but within the lateness
    assert 0 < verdict["unmatched"] < verdict["results"]  # orders of customers without a row, null-padded

    quix = data["peers"]["quix"]
    check_peer_counts(quix, verdict)
    assert quix["processed"] == quix["tuples"]
    assert all(type(quix[k]) is int and quix[k] >= 0 for k in COUNTS)
    assert quix["wrong_version"] <= min(quix["missing"], quix["extra"])
    assert quix["missing_row_arrived_later"] <= quix["missing"]

    check_ratio_machine_plot(data, "quix", plot)
