"""The SplitJoin merger's reading of core releases, without Kafka (services/splitjoin/merger.Intake):
pieces, dedup of an aborted core attempt's releases by `accepted_through`, restart from a
checkpoint, and records it cannot read."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from streamjoin.engine.block import Block, concat
from streamjoin.engine.splitjoin.merge import OrderedMerge
from streamjoin.engine.splitjoin.schedule import Schedule
from streamjoin.schemas.codecs import encode_block
from streamjoin.schemas.splitjoin import CORE_HEADER, CoreMeta, encode_core_release, schedule_epochs
from streamjoin.services import metrics
from streamjoin.services.splitjoin.merger import Intake, MergerCheckpoint
from tests.profiles import examples

SEQ = ("r._g", "s._g")
DTYPES = {"result_id_hi": "uint64", "r._g": "int64", "s._g": "int64"}
Record = tuple[bytes, list[tuple[str, bytes]]]


def intake(cores: int, ordered: bool = True) -> Intake:
    return Intake(OrderedMerge(Schedule.fixed(cores), SEQ, ordered), cores, DTYPES)


def results(core: int, cores: int, lo: int, hi: int) -> Block:
    """Core `core`'s results probing in [lo, hi): deterministic, each pair found by one core only
    (the one storing the older member), the probing member alternating between r and s."""
    pairs = [(g, q) for g in range(lo, hi) for q in range(g) if q % cores == core and (g + q) % 3]
    g = np.array([p for p, _ in pairs], np.int64)
    q = np.array([p for _, p in pairs], np.int64)
    r, s = np.where(g % 2 == 0, g, q), np.where(g % 2 == 0, q, g)
    return Block({"result_id_hi": (g * 1000 + q).astype(np.uint64), "r._g": r, "s._g": s})


def release(core: int, cores: int, lo: int, hi: int) -> list[Record]:
    meta = CoreMeta(core=core, from_g=lo, through=hi, punctuation=hi, watermark=10 * hi,
                    schedule=schedule_epochs(Schedule.fixed(cores)))
    return encode_core_release(meta, results(core, cores, lo, hi))


def pieces(core: int, cores: int, lo: int, hi: int, n: int, written: int) -> list[Record]:
    """The first `written` of `n` pieces of a release (fewer than n: its attempt died)."""
    block = results(core, cores, lo, hi)
    meta = CoreMeta(core=core, from_g=lo, through=hi, punctuation=hi, watermark=10 * hi,
                    schedule=schedule_epochs(Schedule.fixed(cores)), pieces=n)
    cuts = np.linspace(0, len(block), n + 1).astype(int)
    return [(encode_block(block.take(np.arange(cuts[i], cuts[i + 1]))),
             [(CORE_HEADER, meta.model_copy(update={"piece": i}).model_dump_json().encode())]) for i in range(written)]


def keys(block: Block) -> list[tuple[int, int]]:
    g = np.maximum(block["r._g"], block["s._g"]) if len(block) else np.empty(0, np.int64)
    q = np.minimum(block["r._g"], block["s._g"]) if len(block) else np.empty(0, np.int64)
    return list(zip(g.tolist(), q.tolist()))


def expected(cores: int, end: int) -> list[tuple[int, int]]:
    return sorted(k for c in range(cores) for k in keys(results(c, cores, 0, end)))


def feed(merger: Intake, partitions: dict[int, list[Record]], rng: random.Random,
         start: dict[int, int] | None = None) -> Block:
    """Every partition's records from `start` (offset) on, the partitions interleaved at random,
    a release after each record."""
    at = dict(start or dict.fromkeys(partitions, 0))
    out = []
    while any(at[p] < len(r) for p, r in partitions.items()):
        p = rng.choice([p for p, r in partitions.items() if at[p] < len(r)])
        value, headers = partitions[p][at[p]]
        merger.take(p, at[p], value, headers)
        at[p] += 1
        out.append(merger.release())
    return concat(out)


def test_an_aborted_attempt_and_its_retry_with_other_boundaries_give_every_result_once_in_order() -> None:
    cores, end = 2, 12
    partitions = {
        # core 0: [0, 4) committed; an attempt writes [4, 9) and dies; the retry writes [4, 6), [6, 12)
        0: release(0, cores, 0, 4) + release(0, cores, 4, 9) + release(0, cores, 4, 6) + release(0, cores, 6, end),
        # core 1: an attempt writes [0, 7) and [7, 10) and dies; the retry writes [0, 3), [3, 12)
        1: release(1, cores, 0, 7) + release(1, cores, 7, 10) + release(1, cores, 0, 3) + release(1, cores, 3, end),
    }
    for seed in range(20):
        merger = intake(cores)
        out = feed(merger, partitions, random.Random(seed))
        assert keys(out) == expected(cores, end)
        assert merger.merge.held == 0


def test_an_unfinished_release_is_dropped_when_a_new_piece_0_arrives() -> None:
    cores, end = 1, 10
    before = metrics.SPLITJOIN_MERGER_DROPPED.labels("unfinished")._value.get()
    records = release(0, cores, 0, 3) + pieces(0, cores, 3, end, 3, 2) + pieces(0, cores, 3, end, 2, 2)
    merger = intake(cores)
    out = feed(merger, {0: records}, random.Random(0))
    assert keys(out) == expected(cores, end)
    assert metrics.SPLITJOIN_MERGER_DROPPED.labels("unfinished")._value.get() - before == 2


def test_a_release_waits_for_all_its_pieces_and_low_stays_at_its_first() -> None:
    merger = intake(1)
    records = release(0, 1, 0, 3) + pieces(0, 1, 3, 9, 3, 3)
    for offset, (value, headers) in enumerate(records[:-1]):
        merger.take(0, offset, value, headers)
    first = merger.release()
    assert keys(first) == expected(1, 3)
    assert merger.checkpoint(0).lanes[0].low == 1  # the unfinished release's piece 0
    merger.take(0, len(records) - 1, *records[-1])
    assert keys(concat([first, merger.release()])) == expected(1, 9)
    assert merger.checkpoint(0).lanes[0].low == len(records)


@st.composite
def core_histories(draw, core: int, cores: int, end: int) -> list[Record]:
    """One core's partition: releases up to a committed cut, then attempts that died (maybe in
    the middle of a release's pieces) each restarting from a committed cut, then the retry."""
    cuts = sorted(draw(st.sets(st.integers(1, end - 1), max_size=5)) | {0, end})
    records: list[Record] = []
    done = 0  # the committed cuts written so far
    for _ in range(draw(st.integers(0, 2))):
        restart = draw(st.integers(done, len(cuts) - 2))
        for a, b in zip(cuts[done:restart], cuts[done + 1:restart + 1]):
            records += release(core, cores, a, b)
        done = restart
        other = sorted(draw(st.sets(st.integers(cuts[done] + 1, end), min_size=1, max_size=3)))
        for a, b in zip([cuts[done]] + other, other):
            records += release(core, cores, a, b)
        if draw(st.booleans()):
            records += pieces(core, cores, other[-1], end, 2, 1)
    for a, b in zip(cuts[done:], cuts[done + 1:]):
        records += release(core, cores, a, b)
    return records


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_restarts_from_any_checkpoint_write_every_result_once_in_order(data: st.DataObject) -> None:
    """Random core histories (aborted attempts, other boundaries, unfinished pieces), random
    interleavings, and the merger restarted from its last checkpoint at random points (what it
    released since is lost, as an aborted transaction's results are)."""
    cores, end = data.draw(st.integers(1, 3)), data.draw(st.integers(2, 14))
    histories = {c: data.draw(core_histories(c, cores, end)) for c in range(cores)}
    rng = random.Random(data.draw(st.integers(0, 1 << 30)))
    ordered = data.draw(st.booleans())
    merger, ckpt, written = intake(cores, ordered), None, []
    at = dict.fromkeys(histories, 0)
    pending: list[Block] = []
    while any(at[p] < len(r) for p, r in histories.items()):
        p = rng.choice([p for p, r in histories.items() if at[p] < len(r)])
        merger.take(p, at[p], *histories[p][at[p]])
        at[p] += 1
        pending.append(merger.release())
        if rng.random() < 0.5:  # a transaction: what was released is written with the checkpoint
            written += pending
            pending, ckpt = [], merger.checkpoint(0)
            # A release's watermark is 10 x its through: the release never claims more than is written.
            assert ckpt.release_watermark is None or ckpt.release_watermark <= 10 * merger.written_below()
        if rng.random() < 0.15:  # a crash: back to the last checkpoint
            merger, pending = intake(cores, ordered), []
            if ckpt is not None:
                merger.restore(MergerCheckpoint.model_validate_json(ckpt.model_dump_json()))
            at = {p: lane.next for p, lane in enumerate(merger.lanes)}
    written += pending
    out = keys(concat(written))
    assert sorted(out) == expected(cores, end)
    if ordered:
        assert out == sorted(out)
    assert merger.written_below() >= end and merger.release_watermark == 10 * end


def test_a_stale_aborted_release_does_not_regress_a_core_mark() -> None:
    """A retry's release wholly below what an aborted attempt released changes nothing."""
    merger = intake(2)
    sched = schedule_epochs(Schedule.fixed(2))
    for offset, meta in enumerate([CoreMeta(core=0, from_g=0, through=8, punctuation=8, schedule=sched),
                                   CoreMeta(core=0, from_g=0, through=4, punctuation=4, retired=True, schedule=sched)]):
        merger.take(0, offset, *encode_core_release(meta, Block())[0])
    assert merger.merge.marks[0].punctuation == 8 and not merger.merge.marks[0].retired


def _meta(core: st.SearchStrategy[int]) -> st.SearchStrategy[bytes]:
    """A CoreMeta header value, valid or not quite (punctuation past through, too many cores)."""
    return st.builds(lambda c, lo, n, punct, piece, pieces, cores, retired: CoreMeta(
        core=c, from_g=lo, through=lo + n, punctuation=punct, schedule=[(0, cores)], piece=min(piece, pieces - 1),
        pieces=pieces, retired=retired, watermark=lo).model_dump_json().encode(),
        core, st.integers(0, 30), st.integers(0, 30), st.none() | st.integers(0, 70), st.integers(0, 2),
        st.integers(1, 2), st.sampled_from([1, 2, 3, 100]), st.booleans())


_garbage_meta = st.one_of(
    _meta(st.integers(0, 3)), st.binary(max_size=200),
    st.sampled_from([b"{}", b"null", b"[]", b'{"core": -1}', b'{"core":0,"from_g":0,"through":1,"schedule":[]}']),
)
_values = st.one_of(
    st.none(), st.binary(max_size=300),
    st.builds(lambda lo, n, col: encode_block(Block({col: np.arange(lo, lo + n, dtype=np.int64)})),
              st.integers(0, 40), st.integers(0, 5), st.sampled_from(["r._g", "s._g", "x"])),
    st.builds(lambda lo, n: encode_block(results(0, 2, lo, lo + n)), st.integers(0, 30), st.integers(0, 8)),
    st.builds(lambda n: encode_block(Block({"result_id_hi": np.zeros(n, np.uint64), "r._g": np.array(["a"] * n),
                                            "s._g": np.zeros(n)})), st.integers(0, 3)),
    st.builds(lambda n: encode_block(Block({"result_id_hi": np.arange(n), "r._g": np.arange(n, dtype=np.uint32),
                                            "s._g": np.arange(n, dtype=np.int32)})), st.integers(0, 3)),
)
_headers = st.one_of(st.none(), st.lists(st.tuples(st.sampled_from([CORE_HEADER, "x", ""]),
                                                   st.one_of(_garbage_meta, st.none())), max_size=3))


@st.composite
def _records(draw) -> tuple[int, bytes | None, list | None]:
    """A record of some partition: mostly with a plausible header of its own core, else anything."""
    partition = draw(st.integers(-1, 3))
    if partition >= 0 and draw(st.booleans()):
        return partition, draw(_values), [(CORE_HEADER, draw(_meta(st.just(partition))))]
    return partition, draw(_values), draw(_headers)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_records(), max_size=25), st.booleans())
def test_garbage_records_never_raise(records: list, ordered: bool) -> None:
    merger = intake(3, ordered)
    offsets: dict[int, int] = {}
    for partition, value, headers in records:
        offsets[partition] = offsets.get(partition, -1) + 1
        merger.take(partition, offsets[partition], value, headers)
        out = merger.release()
        assert not len(out) or {n: str(out[n].dtype) for n in out.names} == DTYPES
    MergerCheckpoint.model_validate_json(merger.checkpoint(0).model_dump_json())
    merger.holding()
