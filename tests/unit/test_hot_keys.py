"""Hot keys: the heavy-hitter summary (engine/heavy_hitters.py) against exact counts, the hash
worker's per-group counter that names and reports keys (services/hash/hot_keys.py), and the
coordinator's decision with hysteresis (services/coordinator/hot_keys.py), which `streamjoin
status` shows."""

from __future__ import annotations

import itertools

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from streamjoin.engine.block import KEY, Block
from streamjoin.engine.heavy_hitters import KeyCounts
from streamjoin.schemas.control import Heartbeat, HotKey
from streamjoin.services import metrics
from streamjoin.services.coordinator.hot_keys import HotKeys, shares
from streamjoin.services.hash.hot_keys import KeyCounter
from streamjoin.settings import CoordinatorSpec, load
from tests.profiles import examples

pytestmark = pytest.mark.unit


@st.composite
def zipf_keys(draw: st.DrawFn) -> list[int]:
    """Keys as skewed as real ones: Zipf-distributed over a random domain."""
    n = draw(st.integers(0, 3000))
    exponent = draw(st.floats(0.5, 2.0))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return list(rng.zipf(1 + exponent, n) % draw(st.integers(1, 500)))


@hsettings(max_examples=examples(150), deadline=None)
@given(data=st.data(), capacity=st.integers(1, 40))
def test_every_estimate_is_within_the_bound_and_every_heavy_key_is_kept(data: st.DataObject, capacity: int) -> None:
    keys = data.draw(zipf_keys())
    cuts = sorted(data.draw(st.lists(st.integers(0, len(keys)), max_size=8)))
    summary = KeyCounts(capacity)
    for lo, hi in zip([0, *cuts], [*cuts, len(keys)]):
        summary.add(np.asarray(keys[lo:hi], np.int64))
    true = Counter(keys)
    slack = len(keys) / (capacity + 1)
    estimate = dict(zip(summary.keys.tolist(), summary.counts.tolist()))
    assert summary.seen == len(keys) and len(estimate) <= capacity
    for key, count in true.items():
        assert count - slack <= estimate.get(key, 0) <= count, (key, count, estimate.get(key))
        if count > slack:
            assert key in estimate
    # Reported at share s: truly at least s.
    for key, count in zip(*summary.heavy(0.2)):
        assert true[int(key)] >= count >= 0.2 * len(keys)


@hsettings(max_examples=examples(100), deadline=None)
@given(data=st.data(), capacity=st.integers(1, 30))
def test_merged_summaries_keep_the_bound_of_all_their_keys(data: st.DataObject, capacity: int) -> None:
    first, second = data.draw(zipf_keys()), data.draw(zipf_keys())
    a, b = KeyCounts(capacity), KeyCounts(capacity)
    a.add(np.asarray(first, np.int64))
    b.add(np.asarray(second, np.int64))
    both = a.merged(b)
    true, n = Counter(first + second), len(first) + len(second)
    estimate = dict(zip(both.keys.tolist(), both.counts.tolist()))
    assert both.seen == n
    for key, count in true.items():
        assert count - n / (capacity + 1) <= estimate.get(key, 0) <= count


def test_a_summary_of_nothing_reports_nothing() -> None:
    empty = KeyCounts(4)
    empty.add(np.empty(0, np.int64))
    keys, counts = empty.heavy(0.1)
    assert empty.seen == 0 and not len(keys) and not len(counts)


# ------------------------------------------------------------------------- the worker's counter

def job_with(**coordinator: object):
    job = load("streamjoin/jobs/equijoin.yaml")
    spec = job.coordinator.model_copy(update={"reorg_epoch_ms": 10_000, **coordinator})
    return job.model_copy(update={"coordinator": spec})


def block(keys: list[int]) -> Block:
    values = np.asarray(keys, np.int64)
    return Block({KEY: values, "k": values})


def test_the_worker_reports_its_keys_by_text_over_two_epochs_and_forgets_a_group_that_leaves() -> None:
    counter = KeyCounter(job_with(hot_key_share=0.5, hot_key_cool_share=0.16))
    counter.observe(3, [block([7] * 60 + list(range(100, 140))), block([])], now_ms=0)
    counter.observe(5, [block([]), block([9] * 30 + list(range(200, 250)))], now_ms=5_000)
    counted, hot = counter.report({3, 5}, now_ms=6_000)
    assert counted == 180
    assert [(h.group, h.key, h.count) for h in hot] == [(3, "7", 60), (5, "9", 30)]
    # The next epoch still reports the last one's counts beside its own; the one after drops them.
    counter.observe(3, [block([7] * 10), block([])], now_ms=12_000)
    # 190 counted: key 7 at 70 is above 16% of them, key 9 at 30 below.
    assert counter.report({3, 5}, now_ms=12_000) == (190, [HotKey(group=3, key="7", count=70, code=7)])
    counted, hot = counter.report({3, 5}, now_ms=25_000)
    assert counted == 10 and [(h.group, h.key) for h in hot] == [(3, "7")]
    counter.forget(3)
    assert counter.report({3, 5}, now_ms=25_000) == (0, [])


def test_string_keys_are_reported_by_their_text() -> None:
    job = job_with(hot_key_share=0.5, hot_key_cool_share=0.3)
    streams = [s.model_copy(update={"fields": {**s.fields, "k": "str"}}) for s in job.streams]
    counter = KeyCounter(job.model_copy(update={"streams": streams}))
    hashes = np.asarray([11] * 8 + [12, 13], np.int64)  # the KEY column holds hashes of string keys
    texts = np.asarray(["celebrity"] * 8 + ["a", "b"])
    counter.observe(0, [Block({KEY: hashes, "k": texts}), Block({KEY: hashes[:0], "k": texts[:0]})], now_ms=0)
    # ... and carry the key as the engine holds it (its hash), which a split routes by.
    assert counter.report({0}, now_ms=1)[1] == [HotKey(group=0, key="celebrity", count=8, code=11)]


# ----------------------------------------------------------------------- the coordinator's view

def sample(name: str, **labels: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, labels)


CLOCK = itertools.count(0, 3_600_000)  # heartbeats an hour apart unless a test says when


def beat(worker: str, counted: int, *hot: tuple[int, str, int], groups: tuple[int, ...] = (0, 2, 4),
         wall_ms: int | None = None) -> Heartbeat:
    return Heartbeat(worker=worker, wall_ms=next(CLOCK) if wall_ms is None else wall_ms, keys_counted=counted,
                     groups=list(groups), hot_keys=[HotKey(group=g, key=k, count=c) for g, k, c in hot])


def test_a_key_turns_hot_at_the_share_and_cools_only_below_the_lower_one() -> None:
    spec = CoordinatorSpec(hot_key_share=0.3, hot_key_cool_share=0.1, hot_key_min_tuples=100)
    keys = HotKeys(spec)
    keys.on_heartbeat(beat("w1", 1000, (4, "celebrity", 250)), ["w1", "w2"])
    keys.on_heartbeat(beat("w2", 1000), ["w1", "w2"])
    assert not keys.hot  # 12.5% of the job's 2,000
    keys.on_heartbeat(beat("w1", 1000, (4, "celebrity", 900)), ["w1", "w2"])
    assert set(keys.hot) == {(4, "celebrity")} and keys.hot[(4, "celebrity")].worker == "w1"
    assert sample("streamjoin_coordinator_hot_keys") == 1
    assert sample("streamjoin_coordinator_hot_key_share", group="4", key="celebrity") == pytest.approx(0.45)
    keys.on_heartbeat(beat("w1", 1000, (4, "celebrity", 250)), ["w1", "w2"])
    assert set(keys.hot) == {(4, "celebrity")}  # 12.5%: between the shares, it stays hot
    keys.on_heartbeat(beat("w1", 1000), ["w1", "w2"])
    assert not keys.hot and sample("streamjoin_coordinator_hot_keys") == 0
    assert sample("streamjoin_coordinator_hot_key_share", group="4", key="celebrity") is None


def test_a_small_job_has_no_hot_keys_and_a_dead_workers_report_leaves() -> None:
    spec = CoordinatorSpec(hot_key_share=0.3, hot_key_cool_share=0.1, hot_key_min_tuples=1000)
    keys = HotKeys(spec)
    keys.on_heartbeat(beat("w1", 10, (0, "o-2", 4)), ["w1"])
    assert not keys.hot  # 40%, but four tuples
    keys.on_heartbeat(beat("w1", 5000, (0, "k", 4000)), ["w1", "w2"])
    keys.on_heartbeat(beat("w2", 5000), ["w1", "w2"])
    assert set(keys.hot) == {(0, "k")}
    keys.on_heartbeat(beat("w2", 5000), ["w2"])  # w1 died, w2 holds its group: w1's report no longer counts
    assert not keys.hot


def test_a_hot_key_cools_only_once_a_holder_has_counted_its_group_for_two_epochs() -> None:
    spec = CoordinatorSpec(hot_key_share=0.3, hot_key_cool_share=0.1, hot_key_min_tuples=1000, reorg_epoch_ms=20_000)
    keys = HotKeys(spec)
    keys.on_heartbeat(beat("w1", 5000, (0, "k", 4000), groups=(0,), wall_ms=0), ["w1", "w2"])
    keys.on_heartbeat(beat("w2", 5000, groups=(2,), wall_ms=50_000), ["w2"])  # w1 died; its group fails over
    assert set(keys.hot) == {(0, "k")}  # nobody measures it: not cooled
    keys.on_heartbeat(beat("w2", 5000, groups=(0, 2), wall_ms=60_000), ["w2"])
    keys.on_heartbeat(beat("w2", 5000, groups=(0, 2), wall_ms=99_000), ["w2"])
    assert set(keys.hot) == {(0, "k")}  # its new holder has counted it for under two epochs
    keys.on_heartbeat(beat("w2", 5000, groups=(0, 2), wall_ms=100_000), ["w2"])
    assert not keys.hot


def test_a_group_reported_twice_during_a_move_counts_once() -> None:
    found = shares({"old": beat("old", 1000, (2, "k", 500)), "new": beat("new", 1000, (2, "k", 300))})
    assert found[(2, "k")].count == 500 and found[(2, "k")].share == 0.25 and found[(2, "k")].worker == "old"


def test_the_hot_key_shares_are_ordered() -> None:
    with pytest.raises(ValueError, match="hot_key_cool_share"):
        CoordinatorSpec(hot_key_share=0.1, hot_key_cool_share=0.1)
