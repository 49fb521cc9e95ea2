"""A ring node's reaction to each message (the PSP paper's Figure 3, per round):

  Build    insert into the stream's slice (visible from the build's round)
  Probe    cross-purge: tuples older than this node's bound move on to the
           next node (the tail expires them instead); forward the probe;
           probe the first stream of each arriving stream's join order
  Partial  forward it unless it came back to its origin; probe the next stream
  End      forward; at the head, count laps (M-1 close a round: Theorem 1)

Everything a node sends in reaction goes into an `Outbox`, in order: sends to
the next node keep FIFO order, which is what Property 1 rests on. The node
itself never talks to Kafka, so the same code runs in the services and in the
in-memory rings of the property tests.

Forward before probing: given an `early` callback, a node hands over what it
forwards (cross-purge Builds and the Probe, or a passing Partial) before it
probes, and probes into a fresh Outbox, so the next node works on the round
while this one probes its slice instead of the nodes taking turns. The order
to the next node is unchanged (Build(r), Probe(r), then Partial(r)...), only
the first part leaves sooner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from streamjoin.engine.block import ARR, OFF, PART, TS, Block
from streamjoin.engine.psp.messages import Build, End, Message, Partial, Probe, RoundInfo
from streamjoin.engine.psp.plan import RingPlan, count_column, prefixed
from streamjoin.engine.psp.probe import TRIGGER_TS, ProbeFailures, extend
from streamjoin.engine.psp.slices import GLOBAL_SEQ, NodeSlices, ages
from streamjoin.engine.result_ids import result_head


@dataclass
class Outbox:
    to_next: list[Message] = field(default_factory=list)
    direct: list[tuple[str, Build]] = field(default_factory=list)  # handoffs to a node other than the next
    results: list[Block] = field(default_factory=list)
    failures: ProbeFailures = field(default_factory=ProbeFailures)
    round_done: RoundInfo | None = None  # head only: this round has ended everywhere


Early = Callable[[Outbox], None]  # takes what a node forwards before it probes (see the module note)


class RingNode:
    def __init__(self, node_id: str, plan: RingPlan, templates: list[Block]) -> None:
        self.id = node_id
        self.plan = plan
        self.slices = NodeSlices.empty(templates)
        self.rounds: dict[int, RoundInfo] = {}  # rounds seen here and not yet ended

    # ------------------------------------------------------------- messages
    def handle(self, msg: Message, now_ms: int, early: Early | None = None) -> Outbox:
        """React to `msg`. early: if given, called once with what is to be forwarded before the
        local probe runs (see the module note); the Outbox returned then holds only the rest."""
        out = Outbox()
        if isinstance(msg, Build):
            self.slices.streams[msg.stream].insert(msg.tuples, msg.round)
        elif isinstance(msg, Probe):
            out = self._on_probe(msg, out, now_ms, early)
        elif isinstance(msg, Partial):
            out = self._on_partial(msg, out, now_ms, early)
        else:
            self._on_end(msg, out)
        return out

    def release(self, probe: Probe, now_ms: int, early: Early | None = None) -> Outbox:
        """Head only: a new round's tuples enter the ring here. early: as in `handle`."""
        for j, block in enumerate(probe.tuples):
            self.slices.streams[j].insert(block, probe.info.round)
        out = self._on_probe(probe, Outbox(), now_ms, early)
        out.to_next.append(End(probe.info, lap=1))
        return out

    def _on_probe(self, msg: Probe, out: Outbox, now_ms: int, early: Early | None) -> Outbox:
        """Cross-purge, forward, probe; returns the Outbox the probe went into."""
        info = msg.info
        self.rounds[info.round] = info
        self.slices.collect(info.done_below)
        self._cross_purge(info, out)
        if self.id != info.tail:
            out.to_next.append(msg)
        out = _hand_over(out, early)
        for t, block in enumerate(msg.tuples):
            if len(block):
                rows = trigger_rows(self.plan, t, block)
                self._probe(info, t, (t,), rows, out, now_ms)
        return out

    def _on_partial(self, msg: Partial, out: Outbox, now_ms: int, early: Early | None) -> Outbox:
        """Forward (unless back at its origin), probe; returns the Outbox the probe went into."""
        info = self.rounds[msg.round]
        if msg.origin != self.id:
            out.to_next.append(msg)
        out = _hand_over(out, early)
        self._probe(info, msg.trigger, msg.members, msg.rows, out, now_ms)
        return out

    def _on_end(self, msg: End, out: Outbox) -> None:
        info = msg.info
        final = msg.lap >= info.laps(self.plan.m)
        if info.layout[0] != self.id:
            out.to_next.append(msg)
        elif not final:
            out.to_next.append(End(info, msg.lap + 1))  # the head starts the next lap
        else:
            out.round_done = info
        if final:  # nothing of this round reaches this node after its last END (Theorem 1)
            self.rounds.pop(info.round, None)
        self.slices.collect(info.done_below)

    # ------------------------------------------------------- cross-purge
    def _cross_purge(self, info: RoundInfo, out: Outbox) -> None:
        r, tail = info.round, self.id == info.tail
        target = info.handoff.get(self.id)
        for j, s in enumerate(self.plan.streams):
            sl = self.slices.streams[j]
            visible = sl.visible(r)
            if target is not None:
                self._handoff(info, j, visible, target, out)
                continue
            if not visible.any():
                continue
            age = ages(sl.rows, s.rows_window, info.low_ts, info.count_before[j])
            bound = s.size if tail else info.bounds[self.id][j]
            leaving = visible & (age >= bound)
            if not tail and info.cap is not None:
                leaving |= _beyond_cap(visible & ~leaving, info.cap)
            moved = sl.retire(leaving, r)
            if not tail and len(moved):
                out.to_next.append(Build(r, j, moved))

    def _handoff(self, info: RoundInfo, j: int, visible: np.ndarray, target: str, out: Outbox) -> None:
        """Aggressive relocation: the whole slice goes to a neighbour. Forward to the
        successor travels ahead of the probe (visible from this round on); back to
        the predecessor it arrives after this round's probe there, so it counts
        from the next round and stays visible here for this one."""
        sl, r = self.slices.streams[j], info.round
        if target == info.next_of(self.id):
            moved = sl.retire(visible, r)
            if len(moved):
                out.to_next.append(Build(r, j, moved))
        else:
            moved = sl.retire(visible, r + 1)
            if len(moved):
                out.direct.append((target, Build(r + 1, j, moved)))

    # ------------------------------------------------------------ probing
    def _probe(self, info: RoundInfo, trigger: int, members: tuple[int, ...], rows: Block, out: Outbox,
               now_ms: int) -> None:
        order = info.orders[trigger]
        j = order[len(members) - 1]
        sl = self.slices.streams[j]
        grown = extend(self.plan, rows, trigger, frozenset(members), j, sl.access(info.round), out.failures)
        if not len(grown):
            return
        if len(members) + 1 == self.plan.m:
            out.results.append(assemble(self.plan, grown, now_ms))
        else:
            out.to_next.append(Partial(info.round, self.id, trigger, members + (j,), grown))


def _hand_over(out: Outbox, early: Early | None) -> Outbox:
    """What goes on from here: `out` itself without a callback, or (with one) a fresh Outbox
    after `early` took `out`. An empty `out` (the tail forwards no probe, a partial back at its
    origin goes nowhere) is not handed over: there is nothing to send sooner."""
    if early is None or not (out.to_next or out.direct):
        return out
    early(out)
    return Outbox()


def _beyond_cap(candidates: np.ndarray, cap: int) -> np.ndarray:
    """Workload smoothing: past `cap` tuples a non-tail slice sheds its oldest (lowest _g first)."""
    idx = np.flatnonzero(candidates)
    excess = len(idx) - cap
    out = np.zeros(len(candidates), dtype=bool)
    if excess > 0:
        out[idx[:excess]] = True
    return out


def trigger_rows(plan: RingPlan, t: int, block: Block) -> Block:
    """A round's tuples of stream t as one-member rows, each its own trigger."""
    cols = {GLOBAL_SEQ: block[GLOBAL_SEQ], TRIGGER_TS: block[TS]}
    cols |= {count_column(k): block[count_column(k)] for k in range(plan.m)}
    cols |= {prefixed(t, c): block[c] for c in plan.member_columns(t, frozenset({t}))}
    return Block(cols)


def assemble(plan: RingPlan, rows: Block, now_ms: int) -> Block:
    """Complete combinations -> the result block every mode writes (schemas/results.py)."""
    head = result_head([s.topic for s in plan.streams], [rows[prefixed(i, PART)] for i in range(plan.m)],
                       [rows[prefixed(i, OFF)] for i in range(plan.m)], rows[TRIGGER_TS], now_ms)
    cols: dict[str, np.ndarray] = {}
    for i, s in enumerate(plan.streams):
        cols[f"{s.name}.partition"] = rows[prefixed(i, PART)]
        cols[f"{s.name}.offset"] = rows[prefixed(i, OFF)]
        cols[f"{s.name}.ts"] = rows[prefixed(i, TS)]
        for f in s.payload:
            cols[f"{s.name}.{f}"] = rows[prefixed(i, f)]
    cols["newest_arrival_ms"] = np.max([rows[prefixed(i, ARR)] for i in range(plan.m)], axis=0)
    return Block(head | cols)

