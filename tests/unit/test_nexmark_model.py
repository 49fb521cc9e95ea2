"""The Nexmark model (bench/nexmark_model.py) and the nexmark bench's pure pieces: the kinds'
proportions 1:3:46 and consecutive ids; the hot-seller, hot-auction and hot-bidder shares; the
values q3 and q20 filter on; event-time spacing at the rate and disorder bounded by the
out-of-order group; references that point ahead by no more than the model's lead, and do point
ahead (why q3 and q20 are window joins, not as-of joins); chunks a function of the seed; JSON
records the workers decode into the drawn values, of Nexmark's average sizes; the shipped jobs'
windows covering the leads; the oracle comparison counting missing, extra and duplicate rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from streamjoin.bench import nexmark, nexmark_queries as nq
from streamjoin.bench.nexmark_model import (AUCTION, BID, FIELDS, FIRST_PERSON_ID, KINDS, PERSON, STATES, NexmarkModel,
                                            adjusted_numbers, draw, kind_of)
from streamjoin.bench.nexmark_peers import read_csv_results
from streamjoin.bench.nexmark_write import EventPlan, encode, event_rows
from streamjoin.schemas.codecs import DECODERS
from streamjoin.topology.partitioner import partition_for

BASE_MS = 1_700_000_000_000
MODEL = NexmarkModel(rate=10_000, base_ms=BASE_MS)
EVENTS = 50_000


class _Env:
    bootstrap = "127.0.0.1:9"
    workdir = Path("/nonexistent")


@pytest.fixture(scope="module")
def events() -> dict:
    return draw(MODEL, 0, EVENTS)


def test_kinds_come_in_nexmark_proportions_with_consecutive_ids(events: dict) -> None:
    assert [len(events[k]["date_time"]) for k in KINDS] == [EVENTS // 50, 3 * EVENTS // 50, 46 * EVENTS // 50]
    assert np.array_equal(events[PERSON]["id"], np.arange(1000, 1000 + EVENTS // 50))
    assert np.array_equal(events[AUCTION]["id"], np.arange(1000, 1000 + 3 * EVENTS // 50))
    assert np.array_equal(np.bincount(kind_of(np.arange(50))), [1, 3, 46])


def test_hot_sellers_auctions_and_bidders_take_their_shares(events: dict) -> None:
    n = np.arange(EVENTS)
    kinds = kind_of(n)
    last_person = n // 50
    auction_n, bid_n = n[kinds == 1], n[kinds == 2]
    hot_seller = (last_person[auction_n] // 100) * 100 + FIRST_PERSON_ID
    assert np.mean(events[AUCTION]["seller"] == hot_seller) == pytest.approx(3 / 4, abs=0.03)  # hot_sellers_ratio 4
    hot_bidder = (last_person[bid_n] // 100) * 100 + 1 + FIRST_PERSON_ID
    assert np.mean(events[BID]["bidder"] == hot_bidder) == pytest.approx(3 / 4, abs=0.02)  # hot_bidders_ratio 4
    newest_auction = 3 * (bid_n // 50) + 2  # a bid comes after its epoch's three auctions
    hot_auction = (newest_auction // 100) * 100 + 1000
    assert np.mean(events[BID]["auction"] == hot_auction) == pytest.approx(1 / 2, abs=0.02)  # hot_auction_ratio 2


def test_the_values_queries_filter_on_are_nexmarks(events: dict) -> None:
    category = events[AUCTION]["category"]
    assert set(np.unique(category).tolist()) == {10, 11, 12, 13, 14}
    assert np.mean(category == 10) == pytest.approx(0.2, abs=0.03)
    state = events[PERSON]["state"].to_numpy(zero_copy_only=False)
    assert set(state.tolist()) == set(STATES)
    assert np.mean(np.isin(state, ["OR", "ID", "CA"])) == pytest.approx(0.5, abs=0.06)


def test_event_times_follow_the_rate_and_disorder_stays_within_a_group() -> None:
    ts = MODEL.timestamp(np.arange(10_001))
    assert ts[0] == BASE_MS and ts[-1] == BASE_MS + 1000  # 10,000 events a second
    assert np.all(np.diff(ts) >= 0)
    shuffled = NexmarkModel(rate=10_000, base_ms=BASE_MS, out_of_order_group=100)
    n = adjusted_numbers(shuffled, 0, 10_000)
    assert not np.array_equal(n, np.arange(10_000)) and np.array_equal(np.sort(n), np.arange(10_000))
    assert np.all(n // 100 == np.arange(10_000) // 100)  # each event stays in its group of 100


def test_references_point_ahead_within_the_lead_and_sometimes_do(events: dict) -> None:
    person_time = dict(zip(events[PERSON]["id"].tolist(), events[PERSON]["date_time"].tolist()))
    auction_time = dict(zip(events[AUCTION]["id"].tolist(), events[AUCTION]["date_time"].tolist()))
    for referring, field, times, referent in ((AUCTION, "seller", person_time, PERSON),
                                              (BID, "auction", auction_time, AUCTION)):
        known = np.isin(events[referring][field], list(times))
        later = np.array([times[r] for r in events[referring][field][known].tolist()]) - \
            events[referring]["date_time"][known]
        assert later.max() < MODEL.lead_ms(referent)
        assert (later > 0).sum() > 0  # what an as-of join would miss


def test_chunks_are_a_function_of_the_seed() -> None:
    a, b = draw(MODEL, 3, 1000), draw(MODEL, 3, 1000)
    assert all(np.array_equal(np.asarray(a[k][f]), np.asarray(b[k][f])) for k in KINDS for f in FIELDS[k])
    other = draw(NexmarkModel(rate=10_000, base_ms=BASE_MS, random_state=8), 3, 1000)
    assert not np.array_equal(a[BID]["price"], other[BID]["price"])


def test_records_decode_into_the_drawn_values_at_nexmarks_sizes(events: dict) -> None:
    job = nq.events_job(_Env(), "nexmark", 12)
    for i, kind in enumerate(KINDS):
        spec = job.streams[i]
        rows = encode(job, i, events[kind])
        values = rows.values.to_pylist()
        decoded = DECODERS["json"](spec, values, rows.partition.astype(np.int32), np.arange(len(values)),
                                   np.zeros(len(values), np.int64))
        assert not decoded.rejects
        for name, ftype in spec.fields.items():
            want = events[kind][name]
            got = decoded.block[name]
            want = want.to_pylist() if isinstance(want, pa.Array) else want.tolist()
            assert [v.decode() if isinstance(v, bytes) else v for v in np.asarray(got).tolist()] == want, name
        key = spec.key_fields[0]
        assert rows.partition[:50].tolist() == [partition_for(str(k).encode(), 12) for k in
                                                events[kind][key][:50].tolist()]
    sizes = {PERSON: ("name", "email_address", "credit_card", "city", "state", "extra"),
             AUCTION: ("item_name", "description", "extra"), BID: ("extra",)}
    fixed = {PERSON: 8, AUCTION: 48, BID: 32}
    for kind, average in ((PERSON, 200), (AUCTION, 500), (BID, 100)):
        size = fixed[kind] + sum(pc.binary_length(events[kind][f]).to_numpy() for f in sizes[kind])
        assert np.mean(size) == pytest.approx(average, rel=0.05)


def test_the_backlog_rows_split_by_partition_and_keep_their_order() -> None:
    job = nq.events_job(_Env(), "nexmark", 4)
    rows = list(event_rows(job, MODEL, EventPlan(events=2000, chunk_events=1000, producers=1)))
    assert [r.stream for r in rows] == [0, 1, 2, 0, 1, 2]
    bids = rows[2]
    part = bids.take(np.flatnonzero(bids.partition == 1))
    assert set(part.partition.tolist()) == {1} and part.values.to_pylist() == [
        v for v, p in zip(bids.values.to_pylist(), bids.partition.tolist()) if p == 1]


def test_the_shipped_jobs_windows_cover_the_leads_of_both_plans() -> None:
    events_job = nq.events_job(_Env(), "nexmark", 4)
    for plan in (nexmark.QUICK, nexmark.FULL):
        model = NexmarkModel(rate=plan.rate)
        for q in nq.QUERIES:
            job = nq.query_job(_Env(), q, events_job, f"nexmark-{q}")
            assert [s.name for s in job.streams] == list(nq.STREAMS[q])
            assert set(job.input_topics) <= {"nexmark.persons", "nexmark.auctions", "nexmark.bids"}
            assert nq.covers_leads(job, q, model)
    slow = NexmarkModel(rate=10)  # 500 events of lead take 50 s: past the 10 s window
    assert not nq.covers_leads(nq.query_job(_Env(), "q3", events_job, "q3"), "q3", slow)


def test_judging_counts_missing_extra_and_duplicate_rows() -> None:
    expected = pa.table({"a": [1, 2, 3, 3], "b": [1, 1, 1, 1]})
    got = pa.table({"a": [1, 1, 3, 4, 4], "b": [1, 1, 1, 1, 1]})
    verdict = nq.judge(expected, got)
    assert verdict == {"expected": 4, "results": 5, "missing": 2, "extra": 1, "duplicates": 2, "exact": False}
    assert nq.judge(expected, expected)["exact"]


def test_pyflinks_window_starts_read_back_as_epoch_milliseconds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "part-0").write_text("1001,2023-11-14 22:13:20.000\n1002,1970-01-01 00:00:10.000\n")
    table = read_csv_results(tmp_path, "q8")
    assert table.to_pylist() == [{"persons.id": 1001, "window_start": 1_700_000_000_000},
                                 {"persons.id": 1002, "window_start": 10_000}]
