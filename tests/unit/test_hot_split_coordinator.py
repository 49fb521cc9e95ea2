"""The coordinator's part of splitting hot keys (services/coordinator/splits.py): which hot keys
split, over which slots, when they merge and when their slots are free; why a key is refused;
what a restarted coordinator reads back from the placement topic; the setting's refusals; and
the slot's side of the wire: hostile `<job>.split` records dead-lettered, never a crash."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from streamjoin.cli import app
from streamjoin.engine.block import system_block
from streamjoin.job_files import default_job_file
from streamjoin.schemas.control import Heartbeat, HotKey
from streamjoin.schemas.split_records import SPLIT_HEADER, SplitRecord, decode_split, encode_split
from streamjoin.services.coordinator import placement
from streamjoin.services.coordinator.hot_keys import HotKeys
from streamjoin.services.coordinator.splits import Splits, refusal
from streamjoin.services.hash.processor import SLOT_INPUT, group_store, join_plan, run_cycle
from streamjoin.services.io.intake import RecordBuffer, routing_for
from streamjoin.services.io.templates import stream_templates
from streamjoin.settings import JobSettings, load
from streamjoin.state.store import Store
from tests.profiles import examples
from tests.unit.test_intake import Msg

pytestmark = pytest.mark.unit
WORKERS = ["w0", "w1", "w2"]
CLOCK = itertools.count(0, 3_600_000)  # heartbeats an hour apart: every holder has counted two epochs


def _job(slots: int = 3, partitions: int = 6, **join: object) -> JobSettings:
    streams = [{"name": n, "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"],
                "window": {"range_ms": 1_000}} for n in "rs"]
    return load(None, job="hs", partitions=partitions, streams=streams, join=join,
                coordinator={"hot_key_slots": slots, "hot_key_share": 0.3, "hot_key_cool_share": 0.1,
                             "hot_key_min_tuples": 100})


def _beat(worker: str, groups: list[int], hot: list[tuple[int, str, int, int]], counted: int = 1_000,
          splits: dict | None = None) -> Heartbeat:
    return Heartbeat(worker=worker, wall_ms=next(CLOCK), groups=groups, keys_counted=counted, splits=splits or {},
                     hot_keys=[HotKey(group=g, key=k, count=c, code=code) for g, k, c, code in hot])


def _owners(job: JobSettings) -> dict[int, str]:
    return placement.round_robin(WORKERS, job.group_count)  # slots 6, 7, 8 on w0, w1, w2


def test_a_hot_key_splits_over_slots_on_the_other_workers_and_merges_once_it_cools() -> None:
    job = _job()
    owners, judge, splits = _owners(job), HotKeys(job.coordinator), Splits(job)
    judge.on_heartbeat(_beat("w1", [1, 4, 7], [(4, "celebrity", 450, 99)]), WORKERS)
    started = splits.reconcile(judge.hot, owners, WORKERS)
    assert [(r.group, r.key, r.code, r.slots, r.merging) for r in started] == [(4, "celebrity", 99, [6, 8], False)]
    assert {owners[s] for s in started[0].slots} == {"w0", "w2"}  # not the group's owner w1, one slot each
    assert splits.reconcile(judge.hot, owners, WORKERS) == []  # level-triggered: nothing new
    # Between the two shares the key stays hot (hysteresis), so the split stays.
    judge.on_heartbeat(_beat("w1", [1, 4, 7], [(4, "celebrity", 200, 99)]), WORKERS)
    assert splits.reconcile(judge.hot, owners, WORKERS) == []
    judge.on_heartbeat(_beat("w1", [1, 4, 7], [(4, "celebrity", 50, 99)]), WORKERS)
    merging = splits.reconcile(judge.hot, owners, WORKERS)
    assert [(r.episode, r.merging) for r in merging] == [(1, True)]
    # Its group's holder has not applied the merge: it is told again; once it reports the episode
    # ended, the slots are free and the record goes.
    assert splits.behind(_beat("w1", [1, 4, 7], [], splits={1: "split"}))
    assert not splits.behind(_beat("w1", [1, 4, 7], [], splits={1: "merging"}))
    assert splits.ended(_beat("w0", [0, 3, 6], [], splits={1: "ended"})) == []  # not the group's holder
    assert [r.episode for r in splits.ended(_beat("w1", [1, 4, 7], [], splits={1: "ended"}))] == [1]
    assert splits.records == {}


def test_a_key_still_hot_when_its_episode_ends_splits_again_with_a_newer_episode() -> None:
    job = _job()
    owners, splits = _owners(job), Splits(job)
    judge = HotKeys(job.coordinator)
    judge.on_heartbeat(_beat("w1", [4], [(4, "k", 450, 7)]), WORKERS)
    first, = splits.reconcile(judge.hot, owners, WORKERS)
    splits.records[first.episode] = first.model_copy(update={"merging": True})
    splits.ended(_beat("w1", [4], [], splits={first.episode: "ended"}))
    again, = splits.reconcile(judge.hot, owners, WORKERS)
    assert again.episode > first.episode and not again.merging


def test_two_hot_keys_take_different_slots_and_a_third_waits_for_one() -> None:
    job = _job(slots=2)  # slots 6 (w0) and 7 (w1)
    owners, splits, judge = _owners(job), Splits(job), HotKeys(job.coordinator)
    judge.on_heartbeat(_beat("w2", [2, 5, 8], [(2, "a", 350, 1), (5, "b", 350, 2)], counted=700), WORKERS)
    started = splits.reconcile(judge.hot, owners, WORKERS)
    assert [r.slots for r in started] == [[6, 7]]  # the first took both other workers' slots
    assert splits.waiting == {(5, "b")}
    judge.on_heartbeat(_beat("w2", [2, 5, 8], [(2, "a", 10, 1), (5, "b", 350, 2)], counted=700), WORKERS)
    assert [r.merging for r in splits.reconcile(judge.hot, owners, WORKERS)] == [True]  # a cooled
    splits.ended(_beat("w2", [2, 5, 8], [], splits={1: "ended"}))
    later = splits.reconcile(judge.hot, owners, WORKERS)
    assert [(r.group, r.slots) for r in later] == [(5, [6, 7])]


@pytest.mark.parametrize("change, reason", [
    (lambda d: d["streams"].append({**d["streams"][0], "name": "u"}), "multiway"),
    (lambda d: d["streams"][0]["window"].update(rows=5, range_ms=None), "count-window"),
    (lambda d: d.setdefault("join", {}).update(type="full"), "full-join"),
])
def test_joins_that_cannot_split_exactly_are_refused_with_why_and_run_on(change, reason: str) -> None:
    data = _job().model_dump(mode="json")
    change(data)
    job = JobSettings.model_validate(data)
    why = refusal(job)
    assert why is not None and why[0] == reason and len(why[1]) > 20
    splits, judge = Splits(job), HotKeys(job.coordinator)
    judge.on_heartbeat(_beat("w1", [4], [(4, "k", 450, 7)]), WORKERS)
    assert splits.reconcile(judge.hot, _owners(job), WORKERS) == []
    assert splits.refused == {(4, "k")}


def test_the_only_free_slots_on_the_groups_own_worker_split_nothing() -> None:
    job = _job(slots=1)  # slot 6 on w0
    splits, judge = Splits(job), HotKeys(job.coordinator)
    judge.on_heartbeat(_beat("w0", [0, 6], [(0, "k", 450, 7)]), WORKERS)
    assert splits.reconcile(judge.hot, _owners(job), WORKERS) == []
    assert splits.waiting == {(0, "k")}


def test_without_slots_nothing_is_ever_split() -> None:
    job = _job(slots=0)
    judge = HotKeys(job.coordinator)
    judge.on_heartbeat(_beat("w1", [4], [(4, "k", 450, 7)]), WORKERS)
    assert Splits(job).reconcile(judge.hot, _owners(job), WORKERS) == []


def test_a_restarted_coordinator_reads_its_splits_back_and_never_reuses_an_episode(monkeypatch) -> None:
    job = _job(slots=4)  # slots 6, 7, 8, 9 on w0, w1, w2, w0
    splits, judge = Splits(job), HotKeys(job.coordinator)
    judge.on_heartbeat(_beat("w1", [1, 4], [(4, "a", 450, 7), (1, "b", 350, 8)]), WORKERS)
    started = splits.reconcile(judge.hot, _owners(job), WORKERS)
    assert [(r.key, r.slots) for r in started] == [("b", [6, 8]), ("a", [9])]
    ended = started[:1]
    written: list[tuple[bytes, bytes | None]] = []

    class Producer:
        def produce(self, _topic: str, key: bytes, value: bytes | None, partition: int) -> None:
            written.append((key, value))

        def flush(self, _timeout: float) -> int:
            return 0

    placement.store_splits(job, Producer(), started, [], splits.next_episode)  # type: ignore[arg-type]
    placement.store_splits(job, Producer(), [], ended, splits.next_episode)  # type: ignore[arg-type]
    group_record = (b"4", b'{"group": 4, "worker": "w1", "epoch": 1}')
    log = [Msg(job.placement_topic, 0, i, v, None, k) for i, (k, v) in enumerate([group_record, *written])]
    monkeypatch.setattr(placement.kafka, "read_partition", lambda *_a, **_k: log)
    groups, split_records = placement.load_all(job, None)  # type: ignore[arg-type]
    assert list(groups) == [4]
    restarted = Splits.loaded(job, split_records)
    assert sorted(restarted.records) == [r.episode for r in started[1:]]
    assert restarted.next_episode == splits.next_episode > max(r.episode for r in started)


@pytest.mark.parametrize("slots, field", [(-1, "coordinator.hot_key_slots"), (100_000, "coordinator.hot_key_slots")])
def test_a_bad_slot_count_exits_2_naming_the_field(tmp_path: Path, slots: int, field: str) -> None:
    data = yaml.safe_load(default_job_file().read_text())
    data.setdefault("coordinator", {})["hot_key_slots"] = slots
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["topics", "check", "--job", str(path), "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert field in result.output


def test_slots_need_hash_mode_and_probe_spill() -> None:
    with pytest.raises(ValueError, match="worker.spill.mode probe"):
        JobSettings.model_validate(_job().model_dump(mode="json") | {"worker": {"spill": {"mode": "deferred"}}})
    data = _job().model_dump(mode="json")
    data["join"] |= {"mode": "ring"}
    with pytest.raises(ValueError, match="needs join.mode hash"):
        JobSettings.model_validate(data)
    assert _job(slots=2).group_count == 8 and list(_job(slots=2).slots) == [6, 7]


# ------------------------------------------------------------------ the slot's input

def _template() -> list:
    block = system_block(np.array([1, 2]), np.array([5, 6]), np.array([0, 0]), np.array([3, 4]), np.array([0, 0]),
                         {"k": np.array([1, 2]), "ts": np.array([5, 6])})
    return [block, block.take(np.empty(0, np.int64))]


def test_a_split_record_reads_back_as_written() -> None:
    block, empty = _template()
    _, value, headers = encode_split(SplitRecord(3, 1, 7, 123, True, False, [block, empty]))
    back = decode_split(value, headers, [empty, empty])
    assert isinstance(back, SplitRecord) and (back.episode, back.group, back.seq, back.watermark) == (3, 1, 7, 123)
    assert back.blocks[0][("_off")].tolist() == [3, 4] and len(back.blocks[1]) == 0


@settings(max_examples=examples(200), deadline=None)
@given(cut=st.integers(0, 2_000), flip=st.integers(0, 2_000), junk=st.binary(max_size=64),
       header=st.one_of(st.none(), st.binary(max_size=80)))
def test_hostile_split_records_are_refused_with_a_reason_never_raised(cut: int, flip: int, junk: bytes,
                                                                      header: bytes | None) -> None:
    block, empty = _template()
    _, value, headers = encode_split(SplitRecord(3, 1, 7, 123, False, False, [block, empty]))
    spoiled = bytearray(value[:cut] + junk + value[cut:])
    if spoiled:
        spoiled[flip % len(spoiled)] ^= 0xFF
    for v, h in [(bytes(spoiled), headers), (value, [(SPLIT_HEADER, header)] if header is not None else None)]:
        back = decode_split(v, h, [empty, empty])
        assert isinstance(back, (SplitRecord, str))
        if isinstance(back, SplitRecord):
            assert [b.names for b in back.blocks] == [empty.names, empty.names]


def test_a_slot_dead_letters_what_is_not_its_groups_record_and_takes_the_rest(tmp_path: Path) -> None:
    job = _job(slots=1, partitions=1)
    plan = join_plan(job)
    store = group_store(job, plan, Store(tmp_path / "db"), stream_templates(job))
    slot, topic = job.partitions, job.split_topic
    good = SplitRecord(2, 0, 5, 100, True, False, [system_block(
        np.array([1]), np.array([50]), np.array([0]), np.array([3]), np.array([0]),
        {"k": np.array([1]), "ts": np.array([50])}), _template()[1]])
    _, value, headers = encode_split(good)
    no_start = SplitRecord(3, 0, 6, 100, False, False, good.blocks)
    messages = [Msg(topic, 0, 0, b"garbage", [(SPLIT_HEADER, b"{}")]), Msg(topic, 0, 1, value, headers),
                Msg(topic, 0, 2, value, headers), Msg(topic, 0, 3, *encode_split(no_start)[1:])]
    buf = RecordBuffer()
    buf.extend(messages, topic, np.full(4, slot), np.zeros(4, np.int64))
    batch, = run_cycle(job, plan, store, {SLOT_INPUT: buf}, [routing_for(job, 1)] * 2, 0)
    assert [(d.offset, d.reason, d.topic) for d in batch.dead] == [(0, "malformed", topic), (3, "malformed", topic)]
    assert all(d.detail for d in batch.dead)
    assert batch.duplicates == 1  # the record written twice is taken once
    assert (batch.state.checkpoint.slot.episode, batch.state.checkpoint.slot.seq) == (2, 5)
    assert [len(b) for b in batch.appended] == [1, 0] and batch.state.window.watermark == 100
    store.rocksdb.close()
