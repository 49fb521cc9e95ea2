"""The SplitJoin merger's reading of the cores' releases, without Kafka: `Intake` takes the
records of each core partition of `<job>.splitjoin.out`, puts the releases' results in input
order (engine/splitjoin/merge.OrderedMerge) and says what may be released and what the
merger's checkpoint holds. merger.py is the service around it.

Reading a core's partition (`Intake`, no Kafka in it):
  pieces  a release may come in several records (meta.piece of meta.pieces); it counts
          once all its pieces are read, in order. A new piece 0 drops an unfinished
          release of the same core: the attempt that wrote it was aborted.
  dedup   a broker may show an aborted core attempt's records (Tansu does), and the
          core's retry then re-writes the same probing sequence range, maybe cut at
          other boundaries. A core's results for a probing sequence number are
          deterministic, so per core `accepted_through` (the highest `through` taken)
          keeps, of each complete release, only the results probing at or above it.
  bad     a record that cannot be read is counted, logged with its partition and
          offset and skipped: the topic is internal, the merger never stops on one.

Checkpoint (`MergerCheckpoint`): per core partition the next offset to read, `low`
(the first record of the oldest release whose results are not all written, or of an
unfinished release: a restart reads again from there) and `accepted_through` as it
was at `low`; the merge's marks, schedule and `released_below`; the end of the
results partition after the transaction's results; the release watermark and the
(through, watermark) pairs of releases the output has not passed yet.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import structlog
from pydantic import BaseModel, ConfigDict, Field

from streamjoin.engine.block import Block, concat
from streamjoin.engine.outer import NEWEST_ARRIVAL
from streamjoin.engine.result_ids import RESULT_ID_HI, RESULT_ID_LO
from streamjoin.engine.splitjoin.core import sequence_columns
from streamjoin.engine.splitjoin.merge import NO_LIMIT, CoreMark, OrderedMerge
from streamjoin.engine.splitjoin.schedule import Epoch, Schedule
from streamjoin.schemas.result_format import result_columns, result_layout
from streamjoin.schemas.splitjoin import CoreMeta, Headers, SplitJoinWireError, decode_core_release
from streamjoin.services import metrics
from streamjoin.services.io.templates import ring_plan
from streamjoin.settings import JobSettings

log = structlog.get_logger("streamjoin.splitjoin.merger")

_DTYPES = {"int": "int64", "float": "float64", "str": "U", "bool": "bool", "bytes": "S"}  # per field type
# What a result column may arrive as, per dtype the merger holds it in ("U", "S": text of any width).
_ACCEPTED_KINDS = {"int64": "iu", "uint64": "iu", "int32": "iu", "float64": "f", "bool": "b", "U": "U", "S": "S"}
_MAX_PAIRS = 256  # (through, watermark) pairs kept ahead of the frontier; halved beyond (the release lags, safely)


# ------------------------------------------------------------------ checkpoint


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LaneCheckpoint(_Model):
    """One core partition: `next` offset to read, `low` where a restart reads again from, and
    the core's `accepted_through` as it was at `low`."""

    next: int = Field(ge=0)
    low: int = Field(ge=0)
    accepted_through: int = Field(ge=0)


class MarkCheckpoint(_Model):
    """A core's mark in the merge (engine/splitjoin/merge.CoreMark)."""

    punctuation: int = Field(ge=0)
    retired: bool
    reported: bool


class MergerCheckpoint(_Model):
    """The merger's state after one transaction (the module docstring says how it is used)."""

    lanes: dict[int, LaneCheckpoint]  # core partition -> its read position
    marks: dict[int, MarkCheckpoint]
    schedule: list[tuple[int, int]]  # epochs (first_g, cores)
    switches: int = Field(ge=0)
    released_below: int = Field(ge=0)  # every result probing below this is written
    results_end: int = Field(ge=0)  # results partition 0's end after this transaction's results
    release_watermark: int | None = None  # every result of inputs with event time below this is written
    pairs: list[tuple[int, int]] = Field(default_factory=list)  # releases' (through, watermark) ahead of that


# ---------------------------------------------------------------------- intake


@dataclass
class _Held:
    """A taken release some of whose results may not be written yet."""

    offset: int  # its first record
    accepted_before: int  # the core's accepted_through before it
    top: int  # the highest probing sequence among the results taken from it


@dataclass
class _Pieces:
    """A release whose pieces are not all read yet."""

    meta: CoreMeta  # its piece 0's: the release's identity
    offset: int  # its piece 0's offset
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Lane:
    """What the merger knows of one core partition."""

    next: int = 0  # the next offset to take
    accepted_through: int = 0  # results probing below this were taken from an earlier release
    pieces: _Pieces | None = None
    held: list[_Held] = field(default_factory=list)
    replay_until: int = 0  # releases ending below this were taken before the restored checkpoint

    def low(self) -> tuple[int, int]:
        """(where a restart reads again from, accepted_through as it was there)."""
        starts = [(h.offset, h.accepted_before) for h in self.held]
        if self.pieces is not None:
            starts.append((self.pieces.offset, self.accepted_through))
        return min(starts, default=(self.next, self.accepted_through))


class Intake:
    """The merger's reading of the core partitions and its ordered merge, without Kafka."""

    def __init__(self, merge: OrderedMerge, partitions: int, dtypes: Mapping[str, str]) -> None:
        """merge: the ordered merge (its sequence columns name each result's members' `_g`);
        partitions: core partitions (splitjoin.max_cores); dtypes: every column a release's
        results must have -> the dtype the merger holds it in (`result_dtypes`)."""
        self.merge, self.dtypes = merge, dict(dtypes)
        self.lanes = [Lane() for _ in range(partitions)]
        self.pairs: list[tuple[int, int]] = []  # (through, watermark) of releases the output has not passed yet
        self.release_watermark: int | None = None  # every result of inputs with event time below it is written

    def take(self, partition: int, offset: int, value: bytes | None, headers: Headers | None) -> None:
        """One record of core partition `partition` at `offset`, in offset order. Never raises:
        an unreadable record is counted, logged and skipped."""
        if not 0 <= partition < len(self.lanes) or offset < self.lanes[partition].next:
            return  # not a core partition, or read already (a restart's re-read starts at `low`)
        lane = self.lanes[partition]
        lane.next = offset + 1
        try:
            meta, block = decode_core_release(value, headers)
            self._check(partition, meta)
            block = self._normalised(block)
        except SplitJoinWireError as e:
            metrics.SPLITJOIN_MERGER_UNREADABLE.inc()
            log.warning("unreadable core release record skipped", partition=partition, offset=offset, reason=str(e))
            return
        whole = self._assemble(lane, partition, offset, meta, block)
        if whole is not None:
            self._accept(partition, lane, offset, *whole)

    def _check(self, partition: int, meta: CoreMeta) -> None:
        """Raise SplitJoinWireError when a decoded release cannot be merged."""
        if meta.core != partition:
            raise SplitJoinWireError(f"a release of core {meta.core} in partition {partition}")
        if meta.punctuation is not None and meta.punctuation > meta.through:
            raise SplitJoinWireError(f"punctuation {meta.punctuation} beyond through {meta.through}")
        if max(k for _, k in meta.schedule) > len(self.lanes):
            raise SplitJoinWireError(f"a schedule with more cores than the {len(self.lanes)} core partitions: "
                                     f"{meta.schedule}")

    def _normalised(self, block: Block) -> Block:
        """`block` with every number column in the dtype the merger holds it in (so releases
        concatenate without promotion); SplitJoinWireError when a column is missing, unknown or
        of another kind."""
        if not block.columns:
            return block
        if set(block.names) != set(self.dtypes):
            raise SplitJoinWireError(f"result columns {sorted(set(block.names) ^ set(self.dtypes))} missing or unknown")
        wrong = [n for n, d in self.dtypes.items()
                 if block[n].ndim != 1 or block[n].dtype.kind not in _ACCEPTED_KINDS[d]]
        if wrong:
            raise SplitJoinWireError(f"result columns {wrong} of the wrong type")
        return Block({n: v if self.dtypes[n] in ("U", "S") else v.astype(self.dtypes[n], copy=False)
                      for n, v in block.columns.items()})

    def _assemble(self, lane: Lane, partition: int, offset: int, meta: CoreMeta,
                  block: Block) -> tuple[CoreMeta, Block, int] | None:
        """The release `meta`'s piece completes, as (meta, all its results, its first offset);
        None while pieces are missing (or for a piece that belongs to no release being read)."""
        if meta.piece == 0:
            self._drop_unfinished(lane, partition, offset)
            if meta.pieces == 1:
                return meta, block, offset
            lane.pieces = _Pieces(meta, offset, [block])
            return None
        started = lane.pieces
        if started is None or started.meta != meta.model_copy(update={"piece": 0}) or meta.piece != len(started.blocks):
            metrics.SPLITJOIN_MERGER_DROPPED.labels("unfinished").inc()
            log.warning("a release piece out of sequence skipped", partition=partition, offset=offset,
                        piece=meta.piece, pieces=meta.pieces)
            return None
        started.blocks.append(block)
        if len(started.blocks) < meta.pieces:
            return None
        lane.pieces = None
        return started.meta, concat(started.blocks), started.offset

    def _drop_unfinished(self, lane: Lane, partition: int, offset: int) -> None:
        """A new release starts: the one still missing pieces was abandoned (its attempt aborted)."""
        if lane.pieces is None:
            return
        metrics.SPLITJOIN_MERGER_DROPPED.labels("unfinished").inc(len(lane.pieces.blocks))
        log.info("unfinished core release dropped: a new one starts", partition=partition, offset=offset,
                 dropped_from=lane.pieces.offset, read=len(lane.pieces.blocks), pieces=lane.pieces.meta.pieces)
        lane.pieces = None

    def _accept(self, core: int, lane: Lane, last: int, meta: CoreMeta, block: Block, first: int) -> None:
        """A complete release (records `first`..`last`): its results not taken before go to the
        merge, its marks too unless the restored checkpoint counted them already."""
        before = lane.accepted_through
        if meta.through < before:  # wholly re-sent: an aborted attempt's release took it all
            metrics.SPLITJOIN_MERGER_DROPPED.labels("duplicate").inc(len(block))
            return
        replayed = last < lane.replay_until
        kept = block
        if len(block):
            probing, _ = self.merge.order_keys(block)
            new = probing >= before
            # Re-read after a restart: what probes below released_below is written already.
            out = probing < self.merge.released_below if replayed else np.zeros(len(block), bool)
            metrics.SPLITJOIN_MERGER_DROPPED.labels("duplicate").inc(int((~new).sum()))
            metrics.SPLITJOIN_MERGER_DROPPED.labels("released").inc(int((new & out).sum()))
            keep = new & ~out
            kept = block.filter(keep)
            if keep.any():
                lane.held.append(_Held(first, before, int(probing[keep].max())))
        lane.accepted_through = max(before, meta.through)
        self.merge.learn(meta.to_schedule())
        mark = self.merge.marks.get(core)
        if replayed and mark is not None:
            self.merge.add(core, kept, None, mark.retired)
            return
        # Unordered, the merge releases without punctuations; `through` as the core's mark still
        # says how far the output is complete (written_below), for the release watermark.
        self.merge.add(core, kept, meta.punctuation if self.merge.ordered else meta.through, meta.retired)
        bisect.insort(self.pairs, (meta.through, meta.watermark))
        if len(self.pairs) > _MAX_PAIRS:
            self.pairs = self.pairs[len(self.pairs) % 2::2]  # every second one, the newest kept

    def release(self) -> Block:
        """The results the frontier lets go, in input order (with their `_g` columns); none while
        a restart is still reading a core partition up to its checkpoint (the restored marks
        count results that are not back in the merge yet)."""
        if any(lane.next < lane.replay_until for lane in self.lanes):
            return Block()
        block = self.merge.release()
        out_below = self.merge.released_below if self.merge.ordered else NO_LIMIT  # unordered: all of it
        for lane in self.lanes:
            lane.held = [h for h in lane.held if h.top >= out_below]
        # Every core numbers the same input order: a release's (through, watermark) says every
        # input below the watermark has a sequence below `through`, so once the output is
        # complete below `through`, every result of those inputs is written.
        done = bisect.bisect_right(self.pairs, (self.written_below(), NO_LIMIT))
        if done:
            newest = max(w for _, w in self.pairs[:done])
            if self.release_watermark is None or newest > self.release_watermark:
                self.release_watermark = newest
            del self.pairs[:done]
        return block

    def written_below(self) -> int:
        """Every result probing below this sequence number has left the merge."""
        if self.merge.ordered:
            return self.merge.released_below
        return min(self._holds(), default=NO_LIMIT)

    def _holds(self) -> list[int]:
        """Each core's limit on the output (OrderedMerge._holds: the one its frontier is the minimum of)."""
        return [self.merge._holds(c) for c in range(self.merge.schedule.max_cores)]

    def checkpoint(self, results_end: int) -> MergerCheckpoint:
        """The state to restore after this transaction; `results_end`: the results partition's end."""
        lanes = {}
        for p, lane in enumerate(self.lanes):
            low, accepted = lane.low()
            # Mid-replay, the marks count the records up to replay_until already.
            lanes[p] = LaneCheckpoint(next=max(lane.next, lane.replay_until), low=low, accepted_through=accepted)
        marks = {c: MarkCheckpoint(punctuation=m.punctuation, retired=m.retired, reported=m.reported)
                 for c, m in self.merge.marks.items()}
        schedule = self.merge.schedule
        return MergerCheckpoint(lanes=lanes, marks=marks, schedule=[(e.first_g, e.cores) for e in schedule.epochs],
                                switches=schedule.switches, released_below=self.merge.released_below,
                                results_end=results_end, release_watermark=self.release_watermark,
                                pairs=self.pairs)

    def restore(self, ckpt: MergerCheckpoint) -> None:
        """Continue from `ckpt`: each lane reads again from its `low`."""
        self.merge.schedule = Schedule(tuple(Epoch(g, k) for g, k in ckpt.schedule), ckpt.switches)
        self.merge.marks = {c: CoreMark(m.punctuation, m.retired, m.reported) for c, m in ckpt.marks.items()}
        self.merge.released_below = ckpt.released_below
        self.release_watermark, self.pairs = ckpt.release_watermark, sorted(ckpt.pairs)
        for p, saved in ckpt.lanes.items():
            if 0 <= p < len(self.lanes):
                self.lanes[p] = Lane(next=saved.low, accepted_through=saved.accepted_through, replay_until=saved.next)

    def holding(self) -> list[int]:
        """The cores whose limit is the lowest: they hold the output back."""
        holds = self._holds()
        return [c for c, h in enumerate(holds) if h == min(holds)]


def result_dtypes(job: JobSettings) -> dict[str, str]:
    """Every column of a core's results -> the dtype the merger holds it in: the result block
    every mode writes (ids uint64, partitions int32), its internal arrival column and each
    member's `_g`."""
    dtypes = {name: _DTYPES[t] for name, t in result_columns(result_layout(job)).items()}
    dtypes |= {RESULT_ID_HI: "uint64", RESULT_ID_LO: "uint64"} | {f"{s.name}.partition": "int32" for s in job.streams}
    return dtypes | {NEWEST_ARRIVAL: "int64"} | dict.fromkeys(sequence_columns(ring_plan(job)), "int64")


def id_keys(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Result ids (uint64 halves) as one 16-byte value each, comparable with np.isin."""
    return np.stack([np.asarray(hi, np.uint64), np.asarray(lo, np.uint64)], axis=1).view("V16").ravel()
