"""The changelog (state/changelog.py, state/transaction.py): a group's window rebuilt
from its changelog records, read from the checkpoint's low mark only, equals the one
in memory after every batch; chunked values come back whole or not at all; a state
transaction refuses to be used out of order."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.services.io.templates import stream_templates
from streamjoin.services.hash.processor import join_plan
from streamjoin.state import changelog
from streamjoin.state.changelog import CHUNK_BYTES, Image, base_key
from streamjoin.state.partition import checkpoint_key
from streamjoin.state.store import Store
from streamjoin.state.transaction import StateTransaction, TransactionStateError, TxState, Write
from streamjoin.state.windowed import WindowedStore
from tests.unit.test_state import GROUP, _feed, _job, _snapshot
from tests.profiles import examples


class _Log:
    """A changelog partition in memory: records at their offsets, a transaction marker after each cycle's."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes | None] | None] = []  # None: a transaction marker

    def commit(self, writes: list[Write]) -> dict[bytes, int]:
        first: dict[bytes, int] = {}
        for key, value in changelog.records(writes):
            first.setdefault(base_key(key), len(self.records))
            self.records.append((key, value))
        self.records.append(None)
        return first

    def rebuild(self, low: int, through: int) -> Image:
        image = Image()
        for offset in range(low, through + 1):
            record = self.records[offset]
            if record is not None:
                image.apply(record[0], record[1], offset)
        return image


@pytest.mark.parametrize("rows", [False, True], ids=["time-window", "count-window"])
def test_a_window_rebuilt_from_its_changelog_low_mark_equals_the_one_in_memory(tmp_path: Path, rows: bool) -> None:
    job = _job(tmp_path, rows)
    store = WindowedStore(Store(tmp_path / "db"), join_plan(job), stream_templates(job), 1 << 30, changelog=True)
    log = _Log()
    lows: list[int] = []

    def after_each(store: WindowedStore, tx: StateTransaction) -> None:
        lows.append(_log_and_rebuild(log, store, tx, tmp_path / "fresh", job).checkpoint.changelog_low)

    _feed(job, store, GROUP, batches=14, after_each=after_each)
    assert lows == sorted(lows) and lows[-1] > 0  # old batches' records are no longer read
    store.rocksdb.close()


def _log_and_rebuild(log: _Log, store: WindowedStore, tx: StateTransaction, path: Path, job) -> WindowedStore:
    """Commit `tx` to `log`, rebuild the group from the checkpoint's low mark in a fresh store
    under `path`, and check it equals `store`'s; returns the group's state in `store`."""
    state = store.get(GROUP)
    first = log.commit(tx.writes)
    state.logged_at(first, len(log.records))
    image = log.rebuild(state.checkpoint.changelog_low, first[checkpoint_key(GROUP)])
    fresh = WindowedStore(Store(path / str(state.checkpoint.seq)), store.plan, stream_templates(job), 1)
    rebuilt = fresh.install(GROUP, image.values(), image.offsets, len(log.records))
    assert _snapshot(rebuilt.window) == _snapshot(state.window)
    assert rebuilt.checkpoint == state.checkpoint and rebuilt.stored == state.stored
    assert rebuilt.changelog_low(rebuilt.checkpoint.seq + 1) >= state.checkpoint.changelog_low
    fresh.rocksdb.close()
    return state


def test_a_changelog_turned_on_mid_job_logs_the_blocks_stored_before_it(tmp_path: Path) -> None:
    """Blocks stored while the job kept no changelog are written to it with the first batch
    after, so a rebuild from then on misses none."""
    job = _job(tmp_path, rows=True)  # count windows: the first batches' blocks are still live
    before = WindowedStore(Store(tmp_path / "db"), join_plan(job), stream_templates(job), 1 << 30)
    _feed(job, before, GROUP, batches=3)
    assert not before.get(GROUP).checkpoint.in_changelog
    before.rocksdb.close()
    after = WindowedStore(Store(tmp_path / "db"), join_plan(job), stream_templates(job), 1 << 30, changelog=True)
    log = _Log()
    _feed(job, after, GROUP, batches=2,
          after_each=lambda store, tx: _log_and_rebuild(log, store, tx, tmp_path / "fresh", job))
    assert after.get(GROUP).checkpoint.in_changelog
    after.rocksdb.close()


def test_a_value_over_the_chunk_size_is_cut_and_joined_and_its_delete_retracts_every_chunk() -> None:
    big = bytes(range(256)) * (CHUNK_BYTES // 256 * 2 + 3)
    key = b"g/00001/w/00/000000000007"
    put = changelog.records([Write(key, big)])
    assert len(put) == 3 and all(len(v) <= CHUNK_BYTES for _, v in put if v is not None)
    gone = changelog.records([Write(key, None, len(big))])
    assert sorted(k for k, _ in gone) == sorted(k for k, _ in put) and all(v is None for _, v in gone)
    image = Image()
    for offset, (k, v) in enumerate(put):
        image.apply(k, v, 10 + offset)
    assert image.values() == {key: big} and image.offsets == {key: 10}
    partial = Image()
    for offset, (k, v) in enumerate(put[:2]):  # the last chunk never made it
        partial.apply(k, v, offset)
    assert partial.values() == {}


_keys = st.sampled_from([b"g/00002/ckpt"] + [b"g/00002/w/00/%012d" % i for i in range(4)])
_values = st.one_of(st.binary(max_size=64), st.integers(1, 3).map(lambda n: b"v" * (CHUNK_BYTES * n - 7)))


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(_keys, st.one_of(st.none(), _values)), max_size=30))
def test_any_sequence_of_writes_replays_to_what_a_dict_holds(ops: list[tuple[bytes, bytes | None]]) -> None:
    model: dict[bytes, bytes] = {}
    writes = []
    for key, value in ops:
        writes.append(Write(key, value, len(model.get(key, b""))))
        if value is None:
            model.pop(key, None)
        else:
            model[key] = value
    image = Image()
    for offset, (key, value) in enumerate(changelog.records(writes)):
        image.apply(key, value, offset)
    assert image.values() == model


def test_a_state_transaction_moves_only_forward(tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    tx = store.transaction()
    tx.put(b"a", b"1")
    tx.delete(b"b", 3)
    assert tx.prepare() == [Write(b"a", b"1"), Write(b"b", None, 3)] and tx.state is TxState.PREPARED
    with pytest.raises(TransactionStateError, match="prepared, expected started"):
        tx.put(b"c", b"2")
    tx.commit()
    assert tx.state is TxState.COMPLETE and store.get(b"a") == b"1"
    with pytest.raises(TransactionStateError):
        tx.commit()
    failed = store.transaction()
    failed.put(b"a", b"2")
    failed.fail()
    with pytest.raises(TransactionStateError, match="failed"):
        failed.commit()
    assert store.get(b"a") == b"1"
    store.close()
