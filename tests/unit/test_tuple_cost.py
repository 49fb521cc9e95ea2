"""The per-tuple profile tool (bench/tuple_cost.py) on a small run: every phase
is measured and adds up, and the worker's path joins what it is fed."""

from __future__ import annotations

from streamjoin.bench import tuple_cost
from streamjoin.services.hash import processor


def test_a_small_run_times_every_phase_of_the_workers_path() -> None:
    result = tuple_cost.run(rate=400, seconds=12, window_ms=2_000, partitions=4, batch_records=1_000)
    assert result["tuples"] > 0 and result["results"] > 0
    phases = result["us_per_tuple"]
    assert set(phases) == set(tuple_cost.PHASES) and all(us > 0 for us in phases.values())
    assert abs(sum(phases.values()) - result["total_us_per_tuple"]) < 0.01
    # The timers come off again: the worker's functions are its own after the run.
    assert processor.decode_by_group.__name__ == "decode_by_group"
    assert processor.process_batch.__name__ == "process_batch"
