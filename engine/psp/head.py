"""The head's side of the ring: it releases rounds and decides their layout.

* `Sequencer` puts released tuples in the global order (ts, stream,
  partition, offset) and numbers them: `_g` (global), `_sseq` (per stream) and
  on every tuple the per-stream counts up to it (count windows need them).
* `release_before` takes what the watermark lets go: the m source topics are
  merged in event-time order by watermark, as the PSP paper's head does.
* `RoundPlanner` stamps each round with its layout and slice bounds, bounds
  the rounds in flight (1 = PSP, more = PSP-I; by default as many as keep
  every node busy, engine/psp/cost_model.py), and runs resizes: passive
  relocation moves the bounds gradually over `passive_rounds` rounds, so state
  flows to its new owner with ordinary purge traffic; aggressive relocation
  drains the ring (suspend), hands whole slices to a neighbour in one round,
  and resumes on the new layout. Layouts change only between drained rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamjoin.engine.block import OFF, PART, TS, Block, concat
from streamjoin.engine.psp.cost_model import balanced_head_weight, rounds_in_flight
from streamjoin.engine.psp.messages import RoundInfo
from streamjoin.engine.psp.plan import RingPlan, count_column
from streamjoin.engine.psp.slices import GLOBAL_SEQ, STREAM_SEQ


class Sequencer:
    def __init__(self, m: int) -> None:
        self.next_g = 0
        self.counts = [0] * m

    def sequence(self, blocks: list[Block]) -> list[Block]:
        """Per stream, the released tuples sorted by and tagged with the global order."""
        m = len(blocks)
        sizes = [len(b) for b in blocks]
        stream = np.repeat(np.arange(m), sizes)
        ts, part, off = (np.concatenate([b[c] for b in blocks]) if sum(sizes) else np.empty(0, np.int64)
                         for c in (TS, PART, OFF))
        order = np.lexsort((off, part, stream, ts))
        g = np.empty(len(order), np.int64)
        g[order] = self.next_g + np.arange(len(order))
        stream_sorted = stream[order]
        counts_sorted = {k: self.counts[k] + np.cumsum(stream_sorted == k) for k in range(m)}
        out, start = [], 0
        for i, b in enumerate(blocks):
            local_g = g[start:start + sizes[i]]
            local = np.argsort(local_g, kind="stable")
            rank = np.empty(len(order), np.int64)
            rank[order] = np.arange(len(order))
            at = rank[start:start + sizes[i]][local]
            stream_seq = self.counts[i] + 1 + np.arange(sizes[i], dtype=np.int64)
            cols = dict(b.take(local).columns) | {GLOBAL_SEQ: local_g[local], STREAM_SEQ: stream_seq}
            cols |= {count_column(k): counts_sorted[k][at].astype(np.int64) for k in range(m)}
            out.append(Block(cols))
            start += sizes[i]
        self.next_g += len(order)
        self.counts = [c + s for c, s in zip(self.counts, sizes)]
        return out

    def state(self) -> dict:
        """What numbering resumes from (JSON-able): the next global number and the per-stream counts."""
        return {"next_g": self.next_g, "counts": list(self.counts)}

    def restore(self, state: dict) -> None:
        self.next_g, self.counts = int(state["next_g"]), [int(c) for c in state["counts"]]


def release_before(pending: list[Block], watermark: int) -> tuple[list[Block], list[Block]]:
    """Split each stream's pending tuples into (released: ts < watermark, still pending)."""
    released, kept = [], []
    for b in pending:
        early = b[TS] < watermark if len(b) else np.zeros(0, bool)
        released.append(b.filter(early))
        kept.append(b.filter(~early))
    return released, kept


def slice_bounds(plan: RingPlan, layout: tuple[str, ...], dropped: frozenset[str] = frozenset(),
                head_weight: float = 1.0) -> dict[str, tuple[float, ...]]:
    """Slices over the nodes that keep state, equal but for the head's (layout[0]), which is
    `head_weight` times another node's: the head also reads, sequences and logs every tuple,
    so with an equal slice it is the ring's slowest node. A dropped node gets zero width (its
    bound equals its predecessor's, so everything it holds moves on)."""
    keeping = [n for n in layout if n not in dropped]
    weights = {n: (head_weight if n == layout[0] and len(keeping) > 1 else 1.0) for n in keeping}
    total = sum(weights.values())
    out: dict[str, tuple[float, ...]] = {}
    prev, held = tuple(0.0 for _ in plan.streams), 0.0
    for n in layout:
        if n in dropped:
            out[n] = prev
            continue
        held += weights[n]
        frac = 1.0 if n == keeping[-1] else held / total  # the last keeper's bound is the window, exactly
        out[n] = prev = tuple(frac * s.size for s in plan.streams)
    return out


def _blend(a: dict[str, tuple[float, ...]], b: dict[str, tuple[float, ...]], x: float
           ) -> dict[str, tuple[float, ...]]:
    return {n: tuple(p + (q - p) * x for p, q in zip(a[n], b[n])) for n in b}


@dataclass
class _Step:
    """One stage of a resize, run after the ring has drained."""

    layout: tuple[str, ...]
    target: dict[str, tuple[float, ...]]
    rounds: int = 0  # passive: rounds over which bounds move from the current ones to `target`
    handoff: dict[str, str] = field(default_factory=dict)


class RoundPlanner:
    def __init__(self, plan: RingPlan, layout: tuple[str, ...], max_in_flight: int | str = "auto",
                 cap: int | None = None, relocation: str = "passive", passive_rounds: int = 20,
                 head_weight: float | str = "auto") -> None:
        """max_in_flight: the most rounds in the ring at once, an int >= 1 or "auto": the cost
        model's rounds_in_flight for the current layout's length (it follows resizes).
        head_weight: the head's slice relative to another node's (see slice_bounds), in [0, 1], or
        "auto": the cost model's balanced_head_weight for the layout's length (it follows resizes too)."""
        if max_in_flight != "auto" and not (isinstance(max_in_flight, int) and max_in_flight >= 1):
            raise ValueError(f"max_in_flight must be an int >= 1 or 'auto', got {max_in_flight!r}")
        if head_weight != "auto" and not (isinstance(head_weight, (int, float)) and 0.0 <= head_weight <= 1.0):
            raise ValueError(f"head_weight must lie in [0, 1] or be 'auto', got {head_weight!r}")
        self.plan, self.layout = plan, tuple(layout)
        self._max_in_flight, self.cap = max_in_flight, cap
        self.relocation, self.passive_rounds, self._head_weight = relocation, passive_rounds, head_weight
        self.bounds = self._bounds_for(self.layout)
        self._from = self._to = self.bounds
        self._moved, self._span = 0, 0
        self.next_round = 0
        self.in_flight: set[int] = set()
        self.steps: list[_Step] = []

    # -------------------------------------------------------------- rounds
    @property
    def max_in_flight(self) -> int:
        """The bound on rounds in flight now (1 = PSP, more = PSP-I)."""
        if self._max_in_flight == "auto":
            return rounds_in_flight(len(self.layout), self.plan.m)
        return int(self._max_in_flight)

    @property
    def draining(self) -> bool:
        """A resize stage waits: no new rounds until the ring is empty (passive bound moves run on rounds)."""
        return bool(self.steps) and self._moved >= self._span

    def can_release(self) -> bool:
        return not self.draining and len(self.in_flight) < self.max_in_flight

    def next_info(self, low_ts: int, count_before: tuple[int, ...], watermark: int,
                  handoff: dict[str, str] | None = None, now_ms: int = 0) -> RoundInfo:
        if self._span:
            self._moved = min(self._moved + 1, self._span)
            self.bounds = _blend(self._from, self._to, self._moved / self._span)
        r = self.next_round
        self.next_round += 1
        self.in_flight.add(r)
        return RoundInfo(r, self.layout, dict(self.bounds), low_ts, count_before, watermark, self.done_below,
                         self.plan.orders, now_ms, self.cap, dict(handoff or {}))

    @property
    def done_below(self) -> int:
        return min(self.in_flight, default=self.next_round)

    def on_done(self, rnd: int) -> None:
        self.in_flight.discard(rnd)

    # ------------------------------------------------------------ recovery
    def state(self) -> dict:
        """Everything but the rounds in flight, JSON-able: layout, bounds, a passive move's
        progress, the resize stages still to run and the next round's number."""
        return {"layout": list(self.layout), "bounds": _bounds_json(self.bounds), "from": _bounds_json(self._from),
                "to": _bounds_json(self._to), "moved": self._moved, "span": self._span, "next_round": self.next_round,
                "steps": [{"layout": list(s.layout), "target": _bounds_json(s.target), "rounds": s.rounds,
                           "handoff": dict(s.handoff)} for s in self.steps]}

    def restore(self, state: dict) -> None:
        """Back to `state` (from `state()`), with no round in flight."""
        self.layout = tuple(state["layout"])
        self.bounds, self._from, self._to = (_bounds_of(state[k]) for k in ("bounds", "from", "to"))
        self._moved, self._span, self.next_round = int(state["moved"]), int(state["span"]), int(state["next_round"])
        self.steps = [_Step(tuple(s["layout"]), _bounds_of(s["target"]), int(s["rounds"]), dict(s["handoff"]))
                      for s in state["steps"]]
        self.in_flight = set()

    # ------------------------------------------------------------- resizes
    def resize(self, new_layout: tuple[str, ...]) -> None:
        """Plan the move from the current layout to `new_layout` (the head stays first)."""
        new_layout = tuple(new_layout)
        if not new_layout or new_layout[0] != self.layout[0]:
            raise ValueError(f"the head {self.layout[0]} must stay first in the ring, got {list(new_layout)}")
        removed = [n for n in self.layout if n not in new_layout]
        both = tuple(n for n in _merge_orders(self.layout, new_layout))
        handoff = {n: _neighbour_kept(both, n, new_layout) for n in removed}
        if self.relocation == "passive":
            # Grow into the union with removed nodes at zero width, then hand off what is left.
            self.steps.append(_Step(both, self._bounds_for(both, removed), self.passive_rounds))
        if removed:
            self.steps.append(_Step(both, self._bounds_for(both, removed), 0, handoff))
        self.steps.append(_Step(new_layout, self._bounds_for(new_layout)))

    def _bounds_for(self, layout: tuple[str, ...], dropped: list[str] | tuple[str, ...] = ()) -> dict[str, tuple[float, ...]]:
        """slice_bounds for `layout`, the head's weight as configured or for the nodes that keep state."""
        weight = self._head_weight
        if weight == "auto":
            weight = balanced_head_weight(len(layout) - len(dropped))
        return slice_bounds(self.plan, layout, frozenset(dropped), float(weight))

    def step_ready(self) -> _Step | None:
        """The next resize stage, once the ring is drained and the previous stage's rounds are through."""
        if not self.steps or self.in_flight or self._moved < self._span:
            return None
        return self.steps.pop(0)

    def apply(self, step: _Step) -> None:
        if step.layout != self.layout:
            # A new node starts with its predecessor's bound: zero width, filled by purge traffic.
            bounds: dict[str, tuple[float, ...]] = {}
            for i, n in enumerate(step.layout):
                bounds[n] = self.bounds[n] if n in self.bounds else bounds[step.layout[i - 1]]
            self.bounds, self.layout = bounds, step.layout
        if step.rounds:
            self._from, self._to, self._moved, self._span = dict(self.bounds), step.target, 0, step.rounds
        else:
            self.bounds = self._from = self._to = step.target
            self._moved = self._span = 0


def _bounds_json(bounds: dict[str, tuple[float, ...]]) -> dict[str, list[float]]:
    return {n: [float(x) for x in b] for n, b in bounds.items()}


def _bounds_of(raw: dict[str, list[float]]) -> dict[str, tuple[float, ...]]:
    return {n: tuple(float(x) for x in b) for n, b in raw.items()}


def _merge_orders(old: tuple[str, ...], new: tuple[str, ...]) -> list[str]:
    """Union of two rings keeping each one's order: removed nodes stay where they were."""
    out = list(new)
    for i, n in enumerate(old):
        if n not in out:
            before = old[i - 1] if i else None
            out.insert(out.index(before) + 1 if before in out else len(out), n)
    return out


def _neighbour_kept(ring: tuple[str, ...], node: str, kept: tuple[str, ...]) -> str:
    """Whom a removed node hands its slice to: the next kept node toward the tail, else back toward the head."""
    i = ring.index(node)
    for n in ring[i + 1:]:
        if n in kept:
            return n
    for n in reversed(ring[:i]):
        if n in kept:
            return n
    raise ValueError("a ring needs at least one node")


def concat_pending(a: list[Block], b: list[Block]) -> list[Block]:
    return [concat([x, y]) if len(x) and len(y) else (y if len(y) else x) for x, y in zip(a, b)]
