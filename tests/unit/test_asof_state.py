"""The as-of join's state in RocksDB (state/versioned.py): through random batches, restarts
of the store (its blocks read back from disk) and compactions, the results equal the
plain-Python reference's, a restored group equals the one in memory, and the stored
versions stay bounded by what the state holds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from streamjoin.engine.asof import process_asof_window, prune
from streamjoin.engine.block import KEY, OFF, TS, Block, concat
from streamjoin.state import versioned
from streamjoin.state.partition import window_prefix
from streamjoin.state.store import Store
from streamjoin.state.versioned import VersionedStore
from streamjoin.state.windowed import BLOCK_SEQ
from tests.profiles import examples
from tests.unit.test_asof import customers, expected, orders, pairs, plan, scenarios

pytestmark = pytest.mark.unit
GROUP = 5


def open_store(path: Path, join_type: str) -> VersionedStore:
    templates = [orders([]), customers([])]
    templates[1] = Block({k: v for k, v in templates[1].columns.items() if k != "_deleted"})
    return VersionedStore(Store(path), plan(join_type), 1, templates, 1 << 30)


def rows(state) -> tuple[set, set]:  # type: ignore[no-untyped-def]
    """A group's versions (pruned: the engine prunes only now and then) and waiting tuples."""
    asof = state.window.state
    held = prune(asof.versions, asof.horizon(state.window.plan))
    versions = {(k, t, o) for k, t, o in zip(held[KEY].tolist(), held[TS].tolist(), held[OFF].tolist())}
    return versions, set(asof.waiting[OFF].tolist())


def tagged(block: Block, seq: int) -> Block:
    return Block(dict(block.columns) | {BLOCK_SEQ: np.full(len(block), seq, np.int64)})


def run_stored(scenario: dict, path: Path) -> tuple[Block, object]:
    """The scenario's batches through a VersionedStore, reopened from disk at its restarts."""
    store = open_store(path, scenario["join_type"])
    out = []
    arrivals, bounds = scenario["arrivals"], [0, *scenario["cuts"], len(scenario["arrivals"])]
    for n, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        batch = arrivals[lo:hi]
        state = store.get(GROUP)
        seq = state.checkpoint.seq + 1
        deltas = [tagged(orders([r for s, r in batch if s == "o"]), seq),
                  tagged(customers([r for s, r in batch if s == "c"]), seq)]
        outcome = process_asof_window(state.window, deltas, 0)  # type: ignore[arg-type]
        out.append(outcome.results)
        state.checkpoint = state.checkpoint.model_copy(update={"seq": seq, "max_ts": list(state.window.max_ts)})
        tx = store.rocksdb.transaction()
        store.stage(tx, GROUP, state, outcome.accepted)
        tx.commit()
        if n in scenario["restarts"]:
            held = rows(state)
            store.rocksdb.close()
            store = open_store(path, scenario["join_type"])
            assert rows(store.get(GROUP)) == held, "the restored group is the one in memory"
    final = store.get(GROUP).window.state  # type: ignore[attr-defined]
    store.rocksdb.close()
    return concat(out), final


@hsettings(max_examples=examples(75), deadline=None)
@given(scenario=scenarios(), compact=st.sampled_from([None, 0, 1]))
def test_stored_state_joins_what_the_reference_joins(tmp_path_factory: pytest.TempPathFactory, scenario: dict,
                                                     compact: int | None) -> None:
    # compact: None keeps the store's own rule; 0 and 1 rewrite the versions (almost) every batch.
    path = tmp_path_factory.mktemp("asof")
    with pytest.MonkeyPatch.context() as mp:
        if compact is not None:
            mp.setattr(versioned, "_COMPACT_FLOOR_BYTES", 0)
            mp.setattr(versioned, "_COMPACT_FACTOR", compact)
        results, final = run_stored(scenario, path)
    got = pairs(results)
    assert len(got) == len(results), "every result once"
    assert got == expected(scenario, final, plan(scenario["join_type"]))


def test_compaction_keeps_the_stored_versions_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One key updated 200 times: without compaction every batch's block would stay (each holds
    the key's newest version for a while); with it, the store holds one or two blocks."""
    monkeypatch.setattr(versioned, "_COMPACT_FLOOR_BYTES", 0)
    store = open_store(tmp_path, "inner")
    for n in range(200):
        state = store.get(GROUP)
        seq = state.checkpoint.seq + 1
        deltas = [tagged(orders([(1, 100 * n, n)]), seq),
                  tagged(customers([(1, 100 * n, n, False), (2, 100 * n, 1000 + n, n % 2 == 1)]), seq)]
        outcome = process_asof_window(state.window, deltas, 0)  # type: ignore[arg-type]
        state.checkpoint = state.checkpoint.model_copy(update={"seq": seq, "max_ts": list(state.window.max_ts)})
        tx = store.rocksdb.transaction()
        store.stage(tx, GROUP, state, outcome.accepted)
        tx.commit()
    assert len(list(store.rocksdb.scan(window_prefix(GROUP, 1)))) <= 2
    assert len(prune(store.get(GROUP).window.state.versions, 10**9)) <= 2  # type: ignore[attr-defined]
    store.rocksdb.close()


def test_a_deleted_row_stays_deleted_when_its_block_is_read_back(tmp_path: Path) -> None:
    """Customer 1's row of 10 shares its stored block with customer 2's row, which keeps the
    block alive; customer 1 is deleted at 20, in a block of its own. Read back after a
    restart, the first block brings the row of 10 back: the deletion must still hide it from
    the order at 300."""
    scenario = {"arrivals": [("c", (1, 10, 0, False)), ("c", (2, 10, 1, False)),
                             ("c", (1, 20, 2, True)), ("c", (3, 200, 3, False)), ("o", (9, 200, 0)),
                             ("o", (1, 300, 1)), ("c", (3, 400, 4, False))],
                "cuts": [2, 3, 5], "restarts": {2}, "join_type": "inner"}
    results, final = run_stored(scenario, tmp_path)
    assert pairs(results) == expected(scenario, final, plan("inner")) == set()
