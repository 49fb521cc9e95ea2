"""Outer, semi and anti joins of two streams: which rows the join decides, and when.

A row of a decided stream (`JoinPlan.decided`: left, semi and anti the first,
right the second, full both) is *matched* once any result holds it. Its fate is
sealed when it leaves the window: expiry (engine/window_join.expire) drops a
tuple exactly when the watermark proves that no on-time partner can still
arrive (RANGE W: watermark >= ts + W; ROWS N: N newer same-key tuples are
final), and by then every result holding it has been emitted (eagerly, or on
the watermark, which has passed its T). So:

* left / right / full: at expiry, each expiring row that never matched is
  emitted once, null-padded (the other member ABSENT); a matched row never is;
* semi: a row is emitted once, the first time a result holds it;
* anti: at expiry, each expiring row that never matched is emitted once.

The matched rows are kept per decided stream as a set of tuple refs
(partition, offset); a batch's newly matched refs are what the state layer
stores beside its window blocks, so the set survives recovery and migration.
A tumbling or hopping window join (engine/window_instances.py) runs on copies
of each tuple, one per window instance, which share its ref: there a row is a
copy, its ref (partition, offset, instance start), so a match in one instance
decides nothing in another; its marks carry the instance start (WIN) too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamjoin.engine.block import ARR, OFF, PART, TS, WIN, Block
from streamjoin.engine.result_ids import ABSENT, WINDOW_START, result_head

# Per join type (settings: join.type), the streams whose rows the join emits alone.
DECIDED = {"inner": (), "left": (0,), "semi": (0,), "anti": (0,), "right": (1,), "full": (0, 1)}
NEWEST_ARRIVAL = "newest_arrival_ms"  # internal result column (delay metrics), never written


def optional_streams(join_type: str, streams: int) -> tuple[bool, ...]:
    """Per stream of a `streams`-way join of `join_type`, whether a result may lack it (its
    ref and fields are null): every stream other than a decided one, which appears alone."""
    decided = DECIDED[join_type]
    return tuple(any(d != i for d in decided) for i in range(streams))


def ref_keys(partitions: np.ndarray, offsets: np.ndarray, starts: np.ndarray | None = None) -> np.ndarray:
    """One 16-byte value per tuple ref (partition, offset), or 24-byte per copy ref (partition,
    offset, instance start) when `starts` is given (window joins): equal refs, equal values.
    Two int64 do not pack into one losslessly (tuple offsets use 63 bits), so refs are compared
    as bytes."""
    width = 2 if starts is None else 3
    refs = np.empty((len(offsets), width), np.int64)
    refs[:, 0], refs[:, 1] = partitions, offsets
    if starts is not None:
        refs[:, 2] = starts
    return refs.view(f"V{8 * width}").ravel()


def block_ref_keys(block: Block) -> np.ndarray:
    """`ref_keys` of a block of tuples, marks or expired rows: per copy where it carries WIN."""
    return ref_keys(block[PART], block[OFF], block.columns.get(WIN))


@dataclass
class MatchedRefs:
    """The refs of one stream's rows that some result has held, with their event times.

    Sorted by ref bytes for binary search. Rows that expire stay in the set until more than
    half of it is stale, then it is compacted once (in `expired`), so a batch costs what it brings."""

    keys: np.ndarray = field(default_factory=lambda: np.empty(0, "V16"))
    ts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    stale: int = 0  # members that have expired (counted when they do)

    @property
    def live(self) -> int:
        return len(self.keys) - self.stale

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """Mask of `keys` (ref_keys) that are in the set."""
        if not len(self.keys) or not len(keys):
            return np.zeros(len(keys), bool)
        at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return self.keys[at] == keys

    def add(self, keys: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Add refs; returns the mask of those that were new (first occurrence only)."""
        _, first = np.unique(keys, return_index=True)
        fresh = np.zeros(len(keys), bool)
        fresh[first] = True
        fresh &= ~self.contains(keys)
        if fresh.any():
            # An empty set takes the refs' width (16 bytes per tuple ref, 24 per copy ref).
            merged_keys = np.concatenate([self.keys, keys[fresh]]) if len(self.keys) else keys[fresh]
            order = np.argsort(merged_keys, kind="stable")
            self.keys, self.ts = merged_keys[order], np.concatenate([self.ts, ts[fresh]])[order]
        return fresh

    def expired(self, count: int, floor: int | None) -> None:
        """`count` members expired; past half stale, keep only those with ts >= `floor` (a time
        window's floor) — `floor` None: a count window, whose caller removes refs by `discard`."""
        self.stale += count
        if floor is not None and self.stale * 2 > len(self.keys):
            keep = self.ts >= floor
            self.keys, self.ts, self.stale = self.keys[keep], self.ts[keep], 0

    def discard(self, keys: np.ndarray) -> None:
        """Remove these refs (a count window's expired rows)."""
        if len(keys) and len(self.keys):
            keep = ~np.isin(self.keys, keys)
            self.keys, self.ts, self.stale = self.keys[keep], self.ts[keep], 0


def matched_refs(results: Block, stream: str) -> Block:
    """`stream`'s members in a result block, absent ones left out, as marks: PART, OFF, TS, and
    WIN (the result's instance start) for a window join's results."""
    part = results[f"{stream}.partition"]
    present = part != ABSENT
    cols = {PART: part, OFF: results[f"{stream}.offset"], TS: results[f"{stream}.ts"]}
    if WINDOW_START in results.columns:
        cols[WIN] = results[WINDOW_START]
    return Block({k: v[present] for k, v in cols.items()})


def padded(names: tuple[str, ...], topics: tuple[str, ...], templates: list[Block], payloads: list[tuple[str, ...]],
           side: int, rows: Block, now_ms: int, window_ms: int = 0) -> Block:
    """Result rows of `rows` (tuples of stream `side`, with their system columns and payload)
    alone, the other member ABSENT: its partition and offset -1, its ts and fields filler
    (zeros of their types) that no writer reads. Columns in `assemble`'s order.

    names, topics, payloads: per stream; templates: per stream an empty block of its columns;
    window_ms: a window join's instance size (its rows carry WIN)."""
    n = len(rows)
    cols: dict[str, np.ndarray] = {}
    parts, offs = [], []
    for i, name in enumerate(names):
        if i == side:
            part, off, ts = rows[PART], rows[OFF], rows[TS]
            fields = {f: rows[f] for f in payloads[i]}
        else:
            part = np.full(n, ABSENT, np.int32)
            off = np.full(n, ABSENT, np.int64)
            ts = np.zeros(n, np.int64)
            fields = {f: np.zeros(n, templates[i][f].dtype) for f in payloads[i]}
        parts.append(part)
        offs.append(off)
        cols |= {f"{name}.partition": part, f"{name}.offset": off, f"{name}.ts": ts}
        cols |= {f"{name}.{f}": v for f, v in fields.items()}
    cols[NEWEST_ARRIVAL] = np.asarray(rows[ARR], np.int64)
    # A window join's row is a copy: alone in its own instance, which its result names.
    return Block(result_head(list(topics), parts, offs, rows[TS], now_ms, rows.columns.get(WIN), window_ms) | cols)


def first_rows(results: Block, stream: str, payload: tuple[str, ...], fresh: np.ndarray) -> Block:
    """`stream`'s members of the results marked `fresh` (each a row's first match), as a block of
    that stream's system columns and payload (and WIN, a window join's instance start); the
    arrival is the result's newest (the match's). `fresh` indexes `stream`'s present members."""
    present = results[f"{stream}.partition"] != ABSENT
    rows = results.filter(present).filter(fresh)
    taken = {f: rows[f"{stream}.{f}"] for f in payload}
    window = {WIN: rows[WINDOW_START]} if WINDOW_START in rows.columns else {}
    return Block({PART: rows[f"{stream}.partition"], OFF: rows[f"{stream}.offset"], TS: rows[f"{stream}.ts"],
                  ARR: rows[NEWEST_ARRIVAL]} | window | taken)
