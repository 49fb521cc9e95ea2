"""What travels around a PSP ring. Every message belongs to a round.

A round is one block of input tuples released by the head in global order
(ts, stream, partition, offset); it plays the part of the PSP paper's single probe
tuple, so the paper's per-tuple protocol runs once per block:

  Build(r, j, tuples)        tuples entering a node's slice of stream j (visible from round r)
  Probe(r, tuples per stream) the round's new tuples: cross-purge, forward, probe
  Partial(r, origin, members) intermediate results travelling one full lap
  End(r, lap)                closes the round; it makes M-1 laps (Theorem 1)

`RoundInfo` rides on every Probe and End: the layout the round runs on, the
slice bounds, and the facts every node needs to purge for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streamjoin.engine.block import Block


@dataclass(frozen=True)
class RoundInfo:
    round: int
    layout: tuple[str, ...]  # node ids, head first, tail last
    bounds: dict[str, tuple[float, ...]]  # node -> per stream, the oldest age it keeps (ms or rows)
    low_ts: int  # every trigger of this round has ts >= low_ts (the watermark before it)
    count_before: tuple[int, ...]  # per stream, tuples released before this round
    watermark: int  # after this round every tuple with ts < watermark has been released
    done_below: int  # every round below this one has ended (state kept for them can go)
    orders: tuple[tuple[int, ...], ...]  # per trigger stream, the join order: one for the whole ring
    released_ms: int  # wall clock when the head released it: PSP's response latency starts here
    cap: int | None = None  # workload smoothing: slice size bound of non-tail nodes
    handoff: dict[str, str] = field(default_factory=dict)  # node -> neighbour that takes its whole slice

    @property
    def tail(self) -> str:
        return self.layout[-1]

    def next_of(self, node: str) -> str:
        i = self.layout.index(node)
        return self.layout[(i + 1) % len(self.layout)]

    def laps(self, m: int) -> int:
        return max(1, m - 1)


@dataclass(frozen=True)
class Build:
    round: int
    stream: int
    tuples: Block


@dataclass(frozen=True)
class Probe:
    info: RoundInfo
    tuples: tuple[Block, ...]  # per stream, sorted by global sequence


@dataclass(frozen=True)
class Partial:
    round: int
    origin: str  # the node that made it; it is dropped when it gets back there
    trigger: int  # stream of the trigger (the newest member)
    members: tuple[int, ...]  # streams joined so far, in probe order
    rows: Block


@dataclass(frozen=True)
class End:
    info: RoundInfo
    lap: int


Message = Build | Probe | Partial | End
