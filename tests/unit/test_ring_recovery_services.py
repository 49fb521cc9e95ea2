"""The services' half of ring crash recovery without a broker (services/ring/recovery.py):
where rebuilding starts reading the round log, and which results a re-driven round skips."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from streamjoin.bench.local_records import LocalRecord
from streamjoin.engine.block import Block
from streamjoin.engine.result_ids import RESULT_ID_HI, RESULT_ID_LO, result_id_hex
from streamjoin.schemas.ring_epochs import LogMark
from streamjoin.services.ring.recovery import _logged, start_mark, unwritten
from tests.profiles import examples


def _mark(next_round: int, counts: list[int]) -> LogMark:
    return LogMark(next_round=next_round, counts=counts, log_end=10 * next_round)


def test_rebuilding_starts_at_the_latest_place_before_every_kept_tuple() -> None:
    history = [_mark(5, [10, 4]), _mark(9, [20, 8])]
    at = _mark(14, [30, 12])
    # The oldest kept tuples: 21 of stream 0 (after place 9's 20) and 5 of stream 1 (after place 5's 4).
    ranges = {"w0": [[(21, 25)], [(9, 12)]], "w1": [[(25, 31)], [(5, 9)]]}
    start, kept = start_mark(history, at, ranges)
    assert start == history[0] and kept == history
    start, kept = start_mark(history, at, {"w0": [[(21, 31)], [(9, 13)]]})
    assert start == history[1] and kept == [history[1]]  # place 5 is needed no more
    start, kept = start_mark(history, at, {"w0": [[], []]})  # nothing kept anywhere: the checkpoint itself
    assert start == at and kept == []
    start, _ = start_mark(history, at, {"w0": [[(3, 5)], []]})  # older than every place: the log's start
    assert (start.next_round, start.log_end) == (0, 0)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=6), st.integers(1, 60))
def test_the_start_never_skips_a_kept_tuple(steps: list[int], least: int) -> None:
    counts = np.cumsum(steps).tolist()
    places = [_mark(r + 1, [c]) for r, c in enumerate(counts)]
    start, kept = start_mark(places[:-1], places[-1], {"w0": [[(least, least + 1)]]})
    assert start.counts[0] < least  # every tuple from `least` on is in rounds after the start
    later = [p for p in places if p.counts[0] < least and p.next_round > start.next_round]
    assert not later  # and it is the latest such place
    assert all(p.next_round >= start.next_round for p in kept)


def _results(ids: list[int]) -> Block:
    hi = np.array(ids, np.uint64)
    return Block({RESULT_ID_HI: hi, RESULT_ID_LO: hi * np.uint64(7), "x": np.arange(len(ids))})


def test_a_redriven_round_skips_the_results_written_before() -> None:
    written = np.unique(result_id_hex(*(lambda b: (b[RESULT_ID_HI], b[RESULT_ID_LO]))(_results([2, 5]))))
    block = _results([1, 2, 3, 5])
    assert unwritten(block, written)["x"].tolist() == [0, 2]
    assert unwritten(block, np.empty(0, "S32")) is block  # nothing written since: every row goes


@settings(max_examples=examples(150), deadline=None)
@given(st.binary(max_size=60), st.lists(st.tuples(st.sampled_from(["sj-kind", "sj-round", "sj-info", "sj-head",
                                                                   "sj-epoch"]), st.binary(max_size=12)), max_size=5))
def test_an_unreadable_round_log_record_is_skipped_never_raises(value: bytes, headers: list) -> None:
    got = _logged(LocalRecord("band3.ring-rounds", 0, 0, None, value, 0, headers))
    assert got is None or got.probe.info.round >= 0
