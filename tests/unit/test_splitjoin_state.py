"""A SplitJoin core's changelog (state/splitjoin.py), no Kafka: a core driven as the
service drives it logs each release to an in-memory partition; rebuilding from those
records gives the live windows and input order, whatever an attempt that died wrote
after the newest checkpoint; a core that crashes and goes on from its restore finds
the same results (deduplicated by `through`, as the merger does) as one that never
crashed; a core a scale adds starts from core 0's snapshot; hostile checkpoints raise
SplitJoinStateError and nothing else."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from streamjoin.engine.block import OFF, PART, Block
from streamjoin.engine.psp.slices import GLOBAL_SEQ
from streamjoin.engine.reference import RefWindow
from streamjoin.engine.splitjoin.input_order import InputOrder
from streamjoin.engine.splitjoin.core import SplitCore
from streamjoin.engine.splitjoin.schedule import Schedule
from streamjoin.state import changelog
from streamjoin.state import splitjoin as state
from streamjoin.state import splitjoin_records as core_records
from tests.unit.psp_harness import Arrival, block_of, make_plan, template, terms_of
from tests.profiles import examples

FLUSH_TS = 1 << 40


@dataclass(frozen=True)
class Mark:
    mark_id: str
    cores: int


def scenario(rng: random.Random) -> dict:
    windows = [RefWindow(range_ms=rng.randint(5, 60)) if rng.random() < 0.5 else RefWindow(rows=rng.randint(1, 6))
               for _ in range(2)]
    partitions = [rng.randint(1, 2) for _ in range(2)]
    queues: dict[tuple[int, int], list] = {(s, p): [] for s in range(2) for p in range(partitions[s])}
    clock = 0
    n = rng.randint(0, 60)
    marks = sorted(rng.sample(range(n + 1), k=min(rng.randint(0, 2), n + 1)))
    for i in range(n + 1):
        if i in marks:
            mark = Mark(f"m{i}", rng.randint(1, 3))
            for q in queues.values():
                q.append(mark)
        if i == n:
            break
        s = rng.randint(0, 1)
        p = rng.randint(0, partitions[s] - 1)
        clock = max(0, clock + rng.randint(-6, 8))
        queues[(s, p)].append(Arrival(s, clock, p, len(queues[(s, p)]), rng.randint(10, 16), float(rng.randint(0, 6))))
    plan = make_plan(windows, terms_of([((0, 1), "band", 2)] if rng.random() < 0.7 else []), ((1,), (0,)))
    return dict(plan=plan, partitions=tuple(partitions), queues=queues, lateness=rng.randint(0, 10),
                precision=rng.choice([0, 1, 3]), cores=rng.randint(1, 3))


def spec_of(sc: dict, position: int) -> state.CoreSpec:
    return state.CoreSpec(sc["plan"], position, sc["partitions"], sc["lateness"], (block_of([]),) * 2,
                          (template(2),) * 2, sc["precision"])


@dataclass
class Rig:
    """One core as services/splitjoin/core.py drives it, its changelog partition a list."""

    spec: state.CoreSpec
    sc: dict
    rng: random.Random
    records: list[core_records.Record] = field(default_factory=list)
    results: list[tuple[int, Block]] = field(default_factory=list)  # (through, results) per release written
    checkpoints: int = 0

    def __post_init__(self) -> None:
        self.adopt(state.fresh(self.spec, Schedule.fixed(self.sc["cores"]), 0))

    def adopt(self, r: state.Restored) -> None:
        self.order, self.core, self.log, self.taken = r.order, r.core, r.log, r.unlogged
        self.pos = {(int(t[1:]), p): o for t, parts in r.positions.items() for p, o in parts.items()}

    def positions(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for (s, p), o in self.pos.items():
            out.setdefault(f"t{s}", {})[p] = o
        return out

    def read(self) -> bool:
        """Some records of one partition with records left; False when all are read."""
        left = [k for k, q in self.sc["queues"].items() if self.pos.get(k, 0) < len(q)]
        if not left:
            return False
        s, p = self.rng.choice(left)
        q, at = self.sc["queues"][(s, p)], self.pos.get((s, p), 0)
        chunk = []
        while at < len(q) and len(chunk) < self.rng.randint(1, 3) and not isinstance(q[at], Mark):
            chunk.append(q[at])
            at += 1
        if chunk:
            block = block_of(chunk)
            self.taken[s].append(state.taken(block, self.order.add(s, block)))
            self.pos[(s, p)] = at
        else:
            self.pos[(s, p)] = at + 1  # the mark's record is read, as the service counts it
            self.mark(s, p, q[at])
        return True

    def mark(self, s: int, p: int, mark: Mark) -> None:
        """A scale mark, as the service applies it (core 0 keeps a snapshot when it completes one)."""
        done = mark.mark_id in self.order.done_marks
        self.order.scale_mark(s, p, mark.mark_id, mark.cores)
        if self.spec.position == 0 and not done and mark.mark_id in self.order.done_marks:
            self.log.snapshot(self.order, self.positions(), mark.mark_id, self.order.switches[-1].cores)

    def flush_marks(self) -> None:
        for s, n in enumerate(self.sc["partitions"]):
            for p in range(n):
                self.order.advance(s, p, FLUSH_TS)

    def release(self, caught_up: bool = False, die: bool = False) -> None:
        """A release written as the service writes it; `die`: the attempt dies after its
        output and some of its state writes (all visible, as on Tansu), before the checkpoint."""
        tuples = self.order.release()
        self.core.switch(self.order.schedule)
        out = self.core.process(tuples, self.order.horizon(), now_ms=0, caught_up=caught_up)
        self.results.append((out.through, out.results))
        recs = changelog.records(self.log.transaction(self.log.writes(self.core, self.order, self.taken)))
        if die:
            left = recs[:self.rng.randint(0, len(recs))]
            self.records += [(k, v, len(self.records) + i) for i, (k, v) in enumerate(left)]
            return
        for k, v in recs:
            self.log.landed(k, len(self.records))
            self.records.append((k, v, len(self.records)))
        ck = self.log.checkpoint(self.core, self.order, self.positions(), out.punctuation, out.retired)
        self.records.append((core_records.CHECKPOINT_KEY, ck.encode(), len(self.records)))
        self.taken = [[] for _ in self.taken]
        self.checkpoints += 1

    def restore(self) -> state.Restored:
        restored = state.restore(self.spec, self.records, len(self.records))
        if restored is None:
            return state.fresh(self.spec, Schedule.fixed(self.sc["cores"]), len(self.records))
        return restored


def assert_same(order: InputOrder, core: SplitCore, r: state.Restored) -> None:
    for a, b in zip(core.windows.streams, r.core.windows.streams):
        assert sorted(a.rows.names) == sorted(b.rows.names)
        for c in a.rows.names:
            assert np.array_equal(a.rows[c], b.rows[c]), c
    assert (core.batch, core.through, core.schedule) == (r.core.batch, r.core.through, r.core.schedule)
    for a, b in zip(order.newest, r.order.newest):
        assert np.array_equal(a, b)
    for a, b in zip(order.pending, r.order.pending):
        ka, kb = np.lexsort((a[OFF], a[PART])), np.lexsort((b[OFF], b[PART]))
        for c in a.names:
            assert np.array_equal(a[c][ka], b[c][kb]), c
    assert (order.sequencer.next_g, order.sequencer.counts) == (r.order.sequencer.next_g, r.order.sequencer.counts)
    assert (order.schedule, order.marks, order.switches, order.done_marks) == \
           (r.order.schedule, r.order.marks, r.order.switches, r.order.done_marks)


def accepted(results: list[tuple[int, Block]]) -> list[tuple]:
    """The merger's rule: per core, results probing below the through already taken are repeats."""
    taken, out = 0, []
    for through, block in results:
        if len(block):
            keep = np.maximum(block[f"s0.{GLOBAL_SEQ}"], block[f"s1.{GLOBAL_SEQ}"]) >= taken
            out += list(zip(block["s0.partition"][keep].tolist(), block["s0.offset"][keep].tolist(),
                            block["s1.partition"][keep].tolist(), block["s1.offset"][keep].tolist()))
        taken = max(taken, through)
    return out


def run(sc: dict, position: int, seed: int, crashes: bool) -> Rig:
    """Read everything in a random interleaving, releasing now and then; with `crashes`, some
    releases die and the core goes on from what its changelog restores (checked each time)."""
    rig = Rig(spec_of(sc, position), sc, random.Random(seed))
    checked: state.Restored | None = None
    while rig.read():
        if rig.rng.random() < 0.4:
            if crashes and rig.rng.random() < 0.25:
                rig.release(die=True)
                restored = rig.restore()
                if checked is not None:
                    live = checked
                    assert_same(live.order, live.core, restored)
                rig.adopt(restored)
                continue
            rig.release()
            checked = rig.restore()
            assert_same(rig.order, rig.core, checked)
    rig.flush_marks()
    rig.release(caught_up=True)
    assert_same(rig.order, rig.core, rig.restore())
    return rig


@settings(max_examples=examples(75), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 1 << 30))
def test_restore_rebuilds_the_live_core_and_a_crashed_core_finds_the_same_results(seed: int) -> None:
    rng = random.Random(seed)
    sc = scenario(rng)
    position = rng.randint(0, 2)
    clean = run(sc, position, seed + 1, crashes=False)
    crashed = run(sc, position, seed + 2, crashes=True)
    expected = accepted(clean.results)
    found = accepted(crashed.results)
    assert len(expected) == len(set(expected)) and len(found) == len(set(found)), "a result was produced twice"
    assert set(found) == set(expected)


@pytest.mark.parametrize("seed", range(8))
def test_values_chunked_across_records_restore_alike(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks over CHUNK_BYTES go as several records; a dying attempt may leave some of them."""
    monkeypatch.setattr(changelog, "CHUNK_BYTES", 300)
    rng = random.Random(seed)
    sc = scenario(rng)
    clean, crashed = run(sc, 0, seed, crashes=False), run(sc, 0, seed + 1, crashes=True)
    assert any(k and b"#" in k for k, _, _ in crashed.records) or not crashed.core.state_tuples
    assert set(accepted(crashed.results)) == set(accepted(clean.results))


def test_records_after_the_newest_checkpoint_are_ignored() -> None:
    sc = scenario(random.Random(7))
    rig = Rig(spec_of(sc, 0), sc, random.Random(1))
    while rig.read():
        rig.release()
    at_checkpoint = rig.restore()
    end = len(rig.records)
    rig.records += [(core_records.block_key(0, 999), b"not a block", end), (core_records.block_key(0, 0), None, end + 1),
                    (core_records.pending_key(1, 5), b"junk", end + 2), (b"checkpoint#0000/0002", b"{", end + 3)]
    again = rig.restore()
    assert_same(at_checkpoint.order, at_checkpoint.core, again)
    rig.adopt(again)
    rig.release()  # the first transaction after the restore notes what to skip from now on
    assert rig.records[end + 4][0] == core_records.RESTART_KEY
    assert state.newest_checkpoint(rig.records)[0].skip[-1] == (end, end + 4)
    assert_same(rig.order, rig.core, rig.restore())


def test_a_block_record_lost_below_the_checkpoint_is_a_clear_error() -> None:
    rng = random.Random(3)
    for _ in range(50):
        sc = scenario(rng)
        rig = Rig(spec_of(sc, 0), sc, random.Random(2))
        while rig.read():
            rig.release()
        live = [e for blocks in rig.restore().log.blocks for e in blocks]
        if live:
            key, value, offset = rig.records[live[0].offset]
            rig.records[live[0].offset] = (b"block/elsewhere", value, offset)
            with pytest.raises(core_records.SplitJoinStateError):
                rig.restore()
            rig.records[live[0].offset] = (b"other", value, offset)
            with pytest.raises(core_records.SplitJoinStateError, match="records are missing"):
                rig.restore()
            return
    pytest.fail("no scenario stored a tuple")


def test_a_core_added_by_a_scale_starts_from_core_0s_snapshot() -> None:
    """Core 1 of a 1 -> 2 scale: from core 0's snapshot with an empty window, it finds what a
    core 1 that read everything from the start finds (it stored nothing before the switch)."""
    rng = random.Random(11)
    tried = 0
    while tried < 200:
        tried += 1
        sc = scenario(rng)
        sc["cores"] = 1
        for q in sc["queues"].values():
            q[:] = [x for x in q if not isinstance(x, Mark)]
        cut = {k: rng.randint(0, len(q)) for k, q in sc["queues"].items()}
        for k, q in sc["queues"].items():
            q.insert(cut[k], Mark("grow", 2))
        core0 = run(sc, 0, rng.randint(0, 1 << 30), crashes=False)
        ref = next(iter(state.newest_checkpoint(core0.records)[0].bootstraps), None)
        assert ref is not None and ref.cores == 2
        snap, pending = state.read_bootstrap(ref, core0.records, spec_of(sc, 1))
        assert snap.usable_by(1) and not snap.usable_by(2)
        added = Rig(spec_of(sc, 1), sc, random.Random(5))
        added.adopt(state.bootstrap(spec_of(sc, 1), snap, pending, 0))
        while added.read():
            added.release()
        added.flush_marks()
        added.release(caught_up=True)
        assert_same(added.order, added.core, added.restore())
        whole = run(sc, 1, 9, crashes=False)
        assert set(accepted(added.results)) == set(accepted(whole.results))
        if accepted(whole.results):
            return
    pytest.fail("no scenario gave core 1 a result")


# --------------------------------------------------------------------------- hostile checkpoints

def valid_checkpoint() -> core_records.CoreCheckpoint:
    sc = scenario(random.Random(4))
    rig = Rig(spec_of(sc, 0), sc, random.Random(4))
    while rig.read():
        rig.release()
    rig.release()
    return state.newest_checkpoint(rig.records)[0]


def test_checkpoint_round_trip() -> None:
    ck = valid_checkpoint()
    assert core_records.CoreCheckpoint.decode(ck.encode()) == ck


@pytest.mark.parametrize("raw", [
    None, b"", b"{", b"[]", b"\xff\xfe", b'{"version": 2}',
])
def test_unreadable_checkpoints_raise_a_clear_error(raw: bytes | None) -> None:
    with pytest.raises(core_records.SplitJoinStateError, match="unreadable SplitJoin core checkpoint"):
        core_records.CoreCheckpoint.decode(raw)


@pytest.mark.parametrize("change", [
    {"through": 10 ** 30}, {"low": -1}, {"skip": [[5, 5]]}, {"stored": [1]}, {"core": 64},
    {"order": {"epochs": [[3, 2]]}}, {"order": {"epochs": [[0, 0]]}}, {"order": {"counts": [1]}},
    {"positions": {"t0": {"x": 1}}}, {"extra": 1},
])
def test_inconsistent_checkpoints_raise_a_clear_error(change: dict) -> None:
    data = json.loads(valid_checkpoint().encode())
    for k, v in change.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k] = data[k] | v
        else:
            data[k] = v
    with pytest.raises(core_records.SplitJoinStateError):
        core_records.CoreCheckpoint.decode(json.dumps(data).encode())


def test_a_checkpoint_of_another_core_or_other_partitions_is_refused() -> None:
    sc = scenario(random.Random(4))
    rig = Rig(spec_of(sc, 0), sc, random.Random(4))
    while rig.read():
        rig.release()
    rig.release()
    with pytest.raises(core_records.SplitJoinStateError, match="core 0's"):
        state.restore(spec_of(sc, 1), rig.records, len(rig.records))
    other = dict(sc, partitions=tuple(n + 1 for n in sc["partitions"]))
    with pytest.raises(core_records.SplitJoinStateError, match="partition count changed"):
        state.restore(spec_of(other, 0), rig.records, len(rig.records))


VALID = valid_checkpoint()
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=4), max_leaves=20)


@settings(max_examples=examples(400), deadline=None)
@given(st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode()),
                 st.tuples(st.sampled_from(sorted(core_records.CoreCheckpoint.model_fields)), json_values)))
def test_the_checkpoint_decoder_raises_nothing_but_its_error(raw: object) -> None:
    if isinstance(raw, tuple):  # a valid checkpoint with one field replaced by anything
        data = json.loads(VALID.encode())
        data[raw[0]] = raw[1]
        raw = json.dumps(data).encode()
    try:
        core_records.CoreCheckpoint.decode(raw)
    except core_records.SplitJoinStateError:
        pass
