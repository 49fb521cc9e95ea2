"""bench/skew.py's report without a broker: the steady-state cut both runs share, the ratios
and the acceptance they are judged by."""

from __future__ import annotations

import math

import pytest

from streamjoin.bench import skew
from streamjoin.bench.skew_runs import STEADY_FROM, steady


def progress(rate: float, seconds: int, stall_s: int = 0) -> list[tuple[float, float]]:
    """Samples every 0.5 s: nothing for `stall_s`, then `rate` tuples/s."""
    return [(t / 2, max(0.0, (t / 2 - stall_s) * rate)) for t in range(2 * (seconds + stall_s) + 1)]


def test_both_runs_are_cut_where_the_split_run_had_split() -> None:
    runs = {"unsplit": {"progress": progress(1000, 20)}, "split": {"progress": progress(2000, 10)}}
    share = steady(runs, split_s=4.0)  # 8,000 of 20,000 committed by then
    assert share == pytest.approx(0.4)
    assert all("progress" not in r and r["steady_from"] == share for r in runs.values())
    assert runs["unsplit"]["tuples_per_s_steady"] == pytest.approx(1000)
    assert runs["split"]["tuples_per_s_steady"] == pytest.approx(2000)


def test_without_a_split_the_cut_starts_at_a_tenth() -> None:
    runs = {"unsplit": {"progress": progress(1000, 20, stall_s=3)}}
    assert steady(runs, split_s=None) == STEADY_FROM
    assert runs["unsplit"]["tuples_per_s_steady"] == pytest.approx(1000)  # the stalled start-up is left out


def verdict(p99: float) -> dict:
    return {"verified": True, "missing": 0, "extra": 0, "duplicates": 0, "expected": 10, "results": 10,
            "delay_ms": {"p50": p99 / 2, "p95": p99, "p99": p99}}


def case(split_tput: float, split_p99: float, identical: bool = True) -> dict:
    return {"unsplit": {"backlog": {"tuples_per_s": 900.0, "tuples_per_s_steady": 1000.0, "verify": verdict(1)},
                        "live": {"verify": verdict(800.0)}},
            "split": {"backlog": {"tuples_per_s": 1800.0, "tuples_per_s_steady": split_tput,
                                  "identical_to_verified_run": identical},
                      "live": {"verify": verdict(split_p99)}}}


PEERS = {"spark": {"tuples_per_s": 300.0}, "pyflink": {"ran": False, "why": "no venv"}}


def test_ratios_divide_the_figures_they_carry() -> None:
    r = skew.ratios("c", case(2500.0, 200.0), PEERS)
    assert r["c_split_vs_unsplit_throughput"]["ratio"] == pytest.approx(2.5)
    assert r["c_unsplit_vs_split_p99"]["ratio"] == pytest.approx(4.0)
    for name in ("c_unsplit_vs_spark_throughput", "c_split_vs_spark_throughput"):
        assert math.isclose(r[name]["ratio"], r[name]["ours"] / r[name]["peer"])
    assert not any("pyflink" in name for name in r)


@pytest.mark.parametrize("split_tput, split_p99, identical, workers, met", [
    (2500.0, 200.0, True, 3, True),
    (1900.0, 200.0, True, 3, False),   # throughput short of 2x
    (2500.0, 500.0, True, 3, False),   # p99 above half
    (2500.0, 200.0, False, 3, False),  # the split output is not the verified one
    (2500.0, 200.0, True, 2, False),   # not the headline's 3 workers
])
def test_acceptance_needs_both_ratios_exactness_and_three_workers(split_tput: float, split_p99: float,
                                                                  identical: bool, workers: int, met: bool) -> None:
    got = skew.acceptance({skew.HEADLINE.name: case(split_tput, split_p99, identical)}, workers)
    assert got["met"] is met


def test_the_report_takes_the_peers_out_of_the_cases_and_judges_the_headline() -> None:
    cases = {skew.HEADLINE.name: case(2500.0, 200.0) | {"peers": PEERS}}
    got = skew.assemble(skew.QUICK, True, 3, cases)
    name = skew.HEADLINE.name
    assert got["exact"] is True and got["peers"] == {name: PEERS} and "peers" not in got["ours"]["cases"][name]
    assert set(got["ratios"]) == {f"{name}_split_vs_unsplit_throughput", f"{name}_unsplit_vs_split_p99",
                                  f"{name}_unsplit_vs_spark_throughput", f"{name}_split_vs_spark_throughput"}
    assert got["acceptance"]["met"] is True and got["acceptance"]["throughput_ratio"] == pytest.approx(2.5)
