"""The benchmark's arithmetic: rates from progress samples, capacity from a
sweep, ratios, the equijoin key domain, PyFlink's join condition, and that
the window-upkeep benchmark's one-block peer joins as the tiered runs do."""

from __future__ import annotations

import math

from streamjoin.bench import equijoin, ours, report, window_upkeep
from streamjoin.engine.result_ids import RESULT_ID_HI, RESULT_ID_LO
from streamjoin.engine.window_join import process_batch
from streamjoin.bench.peers.pyflink_peer import where_clause


def test_sustained_rate_leaves_start_up_and_tail_out() -> None:
    # 5 s of start-up, then 1000 items/s for 10 s, then a slow tail.
    samples = [(0.0, 0.0), (5.0, 0.0)] + [(5.0 + t, 1000.0 * t) for t in range(1, 11)] + [(25.0, 10_500.0)]
    assert math.isclose(report.sustained_rate(samples), 1000.0)
    assert report.sustained_rate([(1.0, 5.0)]) is None


def test_capacity_is_the_last_step_before_the_first_overload() -> None:
    steps = [{"rate_per_stream": r, "overloaded": o} for r, o in ((1000, False), (2000, False), (3000, True),
                                                                   (4000, False))]
    assert report.capacity(steps) == 2000
    assert report.capacity_reading(steps) == "the last step before the first overloaded one"
    assert report.capacity(steps[2:3]) is None
    assert report.capacity_reading(steps[:2]).startswith("at least")


def test_ratio_keeps_its_figures_and_refuses_missing_ones() -> None:
    assert report.ratio(3.0, 2.0, "x", "u") == {"figure": "x", "unit": "u", "ours": 3.0, "peer": 2.0, "ratio": 1.5}
    assert report.ratio(None, 2.0, "x", "u")["ratio"] is None
    assert report.ratio(3.0, None, "x", "u")["ratio"] is None


def test_equijoin_domain_makes_output_about_input() -> None:
    steps = [ours.Step(r, 30) for r in (1000, 2000, 4000)]
    domain = equijoin.domain_for(steps, 600_000, 0.7)
    levels = int(math.log2(domain))
    n = sum(s.rate * s.seconds for s in steps)  # the window spans the run: every cross-stream pair counts
    output_per_input = (0.7 ** 2 + 0.3 ** 2) ** levels * n * n / (2 * n)
    assert 0.7 < output_per_input < 1.5


def test_a_step_without_results_or_with_slow_p99_is_overloaded() -> None:
    import numpy as np

    assert report.overloaded(report.delay_stats(np.empty(0), 1000.0))
    assert report.overloaded(report.delay_stats(np.array([10.0] * 98 + [2000.0] * 2), 1000.0))
    assert not report.overloaded(report.delay_stats(np.array([10.0] * 99 + [2000.0]), 1000.0))


def test_pyflink_condition_is_the_window_rule() -> None:
    job = equijoin.base_job(equijoin.QUICK)
    assert where_clause(job) == ("r.`k` = s.`k` AND s.t < r.t + INTERVAL '10.000' SECOND(2, 3) "
                                 "AND r.t < s.t + INTERVAL '10.000' SECOND(2, 3)")


def test_delay_histogram_is_exact_for_count_mean_and_share_under_an_edge() -> None:
    import numpy as np

    h = ours.Histogram(np.array([0.5, 1.0, 2.0, np.inf]), np.array([10.0, 99.0, 100.0, 100.0]), 60.0)
    stats = h.stats(1.0)
    assert stats["count"] == 100 and stats["under_threshold"] == 0.99 and math.isclose(stats["mean_ms"], 600.0)
    assert 500.0 <= stats["p50_ms"] <= 1000.0
    assert (h - h).stats(1.0)["count"] == 0


def test_window_upkeep_peer_joins_as_the_runs_do() -> None:
    """The peer the window-upkeep benchmark times (one re-sorted block per stream) gives the
    same results, in the same order, as the tiered runs, batch by batch."""
    plan, runs_window, runs_feed = window_upkeep.filled_window(4000, peer=False)
    _, peer_window, peer_feed = window_upkeep.filled_window(4000, peer=True)
    for _ in range(12):
        ours_out = process_batch(plan, runs_window, runs_feed.next(500), now_ms=0).results
        peer_out = process_batch(plan, peer_window, peer_feed.next(500), now_ms=0).results
        assert len(ours_out) > 0
        for column in (RESULT_ID_HI, RESULT_ID_LO):
            assert ours_out[column].tolist() == peer_out[column].tolist()
    assert runs_window.tuples == peer_window.tuples == 4000
