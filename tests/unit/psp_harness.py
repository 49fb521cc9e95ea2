"""An in-memory PSP ring for property tests: the engine's nodes and head
planner wired by FIFO links, scheduled in a random order that respects only
what Kafka guarantees (per-producer order into a one-partition topic)."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

from streamjoin.engine.block import OFF, PART, TS, Block, system_block
from streamjoin.engine.predicates import Term
from streamjoin.engine.psp.head import RoundPlanner, Sequencer, concat_pending, release_before
from streamjoin.engine.psp.messages import Build, Message, Probe
from streamjoin.engine.psp.node import Outbox, RingNode
from streamjoin.engine.psp.plan import RingPlan, RingStream, count_column
from streamjoin.engine.psp.recovery import LoggedRound, Redrive, rebuild, slice_ranges
from streamjoin.engine.psp.slices import GLOBAL_SEQ, STREAM_SEQ
from streamjoin.engine.reference import RefWindow, ThetaTuple, reference_theta_join

FIELDS = ("x", "y")


@dataclass(frozen=True)
class Arrival:
    stream: int
    ts: int
    part: int
    off: int
    x: int
    y: float


def make_plan(windows: list[RefWindow], terms: tuple[Term, ...], orders: tuple[tuple[int, ...], ...]) -> RingPlan:
    streams = tuple(RingStream(f"s{i}", f"t{i}", w.range_ms, w.rows, FIELDS) for i, w in enumerate(windows))
    return RingPlan(streams, terms, orders)


def block_of(arrivals: list[Arrival]) -> Block:
    return system_block(np.zeros(len(arrivals)), [a.ts for a in arrivals], [a.part for a in arrivals],
                        [a.off for a in arrivals], [a.ts for a in arrivals],
                        {"x": np.array([a.x for a in arrivals], np.int64),
                         "y": np.array([a.y for a in arrivals], np.float64)})


def template(m: int) -> Block:
    cols = dict(block_of([]).columns) | {GLOBAL_SEQ: np.empty(0, np.int64), STREAM_SEQ: np.empty(0, np.int64)}
    return Block(cols | {count_column(k): np.empty(0, np.int64) for k in range(m)})


@dataclass
class Ring:
    plan: RingPlan
    planner: RoundPlanner
    rng: random.Random
    nodes: dict[str, RingNode] = field(default_factory=dict)
    logs: dict[str, deque] = field(default_factory=dict)
    links: dict[tuple[str, str], deque] = field(default_factory=dict)
    results: list[tuple] = field(default_factory=list)
    failed: set[tuple] = field(default_factory=set)
    max_state: dict[str, int] = field(default_factory=dict)
    # Crash recovery (engine/psp/recovery.py): the round log, with the planner's state after each
    # release; resize requests, with the log length when made; the last checkpoint; the steps
    # (events) at which the whole ring crashes and rolls back; results written before a crash.
    crash_at: frozenset[int] = frozenset()
    log: list[tuple[Probe, dict]] = field(default_factory=list)
    resize_log: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    checkpoint: dict | None = None
    redrive: Redrive = field(default_factory=lambda: Redrive([]))
    written: set[tuple] = field(default_factory=set)
    events: int = 0
    crashes: int = 0
    redriven: int = 0

    def __post_init__(self) -> None:
        self.checkpoint = {"next_round": 0, "ranges": {}, "log_len": 0, "planner": self.planner.state()}

    def node(self, n: str) -> RingNode:
        if n not in self.nodes:
            self.nodes[n] = RingNode(n, self.plan, [template(self.plan.m)] * self.plan.m)
            self.logs[n] = deque()
        return self.nodes[n]

    def deliver(self, sender: str, out: Outbox, next_of: str) -> None:
        for msg in out.to_next:
            self._send(sender, next_of, msg)
        for target, build in out.direct:
            self.node(target)
            self.logs[target].append(build)  # flushed before the sender goes on
        for res in out.results:
            cols = [(res[f"{s.name}.partition"], res[f"{s.name}.offset"]) for s in self.plan.streams]
            refs = [tuple((f"t{i}", int(p[r]), int(o[r])) for i, (p, o) in enumerate(cols)) for r in range(len(res))]
            self.results += [ref for ref in refs if ref not in self.written]  # the writer skips written ids
        for _, rows, _ in out.failures.entries:
            self.failed |= {int(g) for g in rows[GLOBAL_SEQ]}
        if out.round_done is not None:
            self.planner.on_done(out.round_done.round)

    def _send(self, sender: str, receiver: str, msg: Message) -> None:
        self.node(receiver)
        if sender == receiver:
            self.logs[receiver].append(msg)
        else:
            self.links.setdefault((sender, receiver), deque()).append(msg)

    def step(self) -> bool:
        """One random asynchronous event (or a crash of the whole ring, at the steps in
        `crash_at`); False when nothing is left to do."""
        self.events += 1
        if self.events in self.crash_at:
            self.crash()
        self.pump_redrive()
        moves = [k for k, q in self.links.items() if q]
        works = [n for n, q in self.logs.items() if q]
        if not moves and not works:
            return False
        if moves and (not works or self.rng.random() < 0.5):
            s, r = self.rng.choice(moves)
            self.logs[r].append(self.links[(s, r)].popleft())
            return True
        n = self.rng.choice(works)
        msg = self.logs[n].popleft()
        info_next = self._next_for(n, msg)
        # Pipelined as the services run it: what a node forwards leaves before it probes.
        early = lambda out: self.deliver(n, out, info_next)  # noqa: E731
        self.deliver(n, self.nodes[n].handle(msg, now_ms=0, early=early), info_next)
        self.max_state[n] = max(self.max_state.get(n, 0), self.nodes[n].slices.tuples)
        return True

    def _next_for(self, n: str, msg: Message) -> str:
        rnd = msg.round if isinstance(msg, Build) else msg.info.round if hasattr(msg, "info") else msg.round
        info = self.nodes[n].rounds.get(rnd) or getattr(msg, "info", None)
        return info.next_of(n) if info is not None else n

    def release(self, tuples: list[Block], low_ts: int, counts: tuple[int, ...], wm: int,
                handoff: dict[str, str] | None = None) -> None:
        info = self.planner.next_info(low_ts, counts, wm, handoff)
        probe = Probe(info, tuple(tuples))
        self.log.append((probe, self.planner.state()))
        self._release(probe)

    def _release(self, probe: Probe) -> None:
        info = probe.info
        head = self.node(info.layout[0])
        for n in info.layout:
            self.node(n)
        early = lambda out: self.deliver(head.id, out, info.next_of(head.id))  # noqa: E731
        self.deliver(head.id, head.release(probe, now_ms=0, early=early), info.next_of(head.id))

    def resize(self, layout: tuple[str, ...]) -> None:
        self.resize_log.append((len(self.log), layout))
        self.planner.resize(layout)

    # -------------------------------------------------------------- recovery
    def may_checkpoint(self) -> None:
        """At a drained point (no round in flight, no resize pending): every node's ranges."""
        if self.planner.in_flight or self.planner.steps or self.redrive:
            return
        nxt = self.planner.next_round
        self.checkpoint = {"next_round": nxt, "log_len": len(self.log), "planner": self.planner.state(),
                           "ranges": {n: slice_ranges(node.slices, nxt) for n, node in self.nodes.items()}}

    def crash(self) -> None:
        """Every node and link loses everything; the ring restores the last checkpoint from the round
        log, the planner the state after the last logged round (and the resizes asked since), and the
        logged rounds after the checkpoint are released again."""
        self.crashes += 1
        self.written |= set(self.results)
        cp = self.checkpoint
        before = [probe.tuples for probe, _ in self.log[:cp["log_len"]]]
        templates = [template(self.plan.m)] * self.plan.m
        for n in list(self.nodes):
            self.nodes[n] = RingNode(n, self.plan, templates)
            self.nodes[n].slices = rebuild(templates, cp["ranges"].get(n), before)
            self.logs[n] = deque()
        self.links.clear()
        after = self.log[cp["log_len"]:]
        self.planner.restore(after[-1][1] if after else cp["planner"])
        for at, layout in self.resize_log:
            if at >= len(self.log):
                self.planner.resize(layout)
        self.redrive = Redrive([LoggedRound(0, probe, {}) for probe, _ in after])

    def pump_redrive(self) -> None:
        while (logged := self.redrive.ready(self.planner.in_flight)) is not None:
            self.planner.in_flight.add(logged.round)
            self.redriven += 1
            self._release(logged.probe)

    def drain(self) -> None:
        while self.step():
            pass


def run_ring(plan: RingPlan, arrivals: list[Arrival], layout: tuple[str, ...], lateness: int, cuts: int,
             seed: int, max_in_flight: int = 1, cap: int | None = None, relocation: str = "passive",
             resizes: list[tuple[str, ...]] = (), crash_at: frozenset[int] = frozenset(),
             head_weight: float | str = "auto") -> tuple[list[tuple], set[tuple], Ring]:
    """Feed `arrivals` in order, `cuts` batches; returns (emitted refs, late refs, ring).
    `crash_at`: the events (ring steps) at which the whole ring crashes and rolls back;
    `head_weight`: the head's slice relative to another node's (RoundPlanner)."""
    rng = random.Random(seed)
    planner = RoundPlanner(plan, layout, max_in_flight, cap, relocation, passive_rounds=3, head_weight=head_weight)
    ring = Ring(plan, planner, rng, crash_at=crash_at)
    seq = Sequencer(plan.m)
    empty = [block_of([]) for _ in range(plan.m)]
    pending = list(empty)
    max_ts = [None] * plan.m
    wm = np.iinfo(np.int64).min // 4
    late: set[tuple] = set()
    bounds = sorted({0, len(arrivals), *rng.sample(range(1, max(2, len(arrivals))), min(cuts, max(0, len(arrivals) - 1)))})
    resize_at = {rng.randrange(len(bounds)): r for r in resizes}
    batches = [arrivals[a:b] for a, b in zip(bounds, bounds[1:])] + [[]]
    for bi, batch in enumerate(batches):
        final = bi == len(batches) - 1
        if bi in resize_at:
            ring.resize(resize_at[bi])
        for i in range(plan.m):
            mine = [a for a in batch if a.stream == i]
            on_time = [a for a in mine if a.ts >= wm]
            late |= {(f"t{i}", a.part, a.off) for a in mine if a.ts < wm}
            pending = concat_pending(pending, [block_of(on_time) if k == i else empty[k] for k in range(plan.m)])
            if on_time:
                max_ts[i] = max([a.ts for a in on_time] + ([max_ts[i]] if max_ts[i] is not None else []))
        seen = [t for t in max_ts if t is not None]
        new_wm = (max(seen) + 1 if final and seen else
                  min(max_ts) - lateness if all(t is not None for t in max_ts) else wm)
        new_wm = max(wm, new_wm)
        _run_until_release_allowed(ring)
        released, pending = release_before(pending, new_wm)
        counts = tuple(seq.counts)
        ring.release(seq.sequence(released), wm, counts, new_wm)
        wm = new_wm
        for _ in range(rng.randrange(0, 30)):
            ring.step()
    while True:
        while planner.steps:
            _run_until_release_allowed(ring)
            if planner.steps and not planner.draining:  # passive bounds still moving: they move on rounds
                ring.release([template(plan.m) for _ in plan.streams], wm, tuple(seq.counts), wm)
        ring.drain()
        if not planner.steps:  # a crash while draining restores the resize stages still to run
            return ring.results, late, ring


def _run_until_release_allowed(ring: Ring) -> None:
    """Advance the ring until the head may release; apply resize stages when drained (and no
    logged round waits to be released again); checkpoint at random drained points."""
    while True:
        if ring.rng.random() < 0.5:
            ring.may_checkpoint()
        step = ring.planner.step_ready() if not ring.redrive else None
        if step is not None:
            ring.planner.apply(step)
            if step.handoff:
                ring.release([template(ring.plan.m) for _ in ring.plan.streams], np.iinfo(np.int64).min // 4,
                             tuple(0 for _ in ring.plan.streams), np.iinfo(np.int64).min // 4, step.handoff)
            continue
        if ring.planner.can_release() and not ring.redrive:
            return
        if not ring.step():
            raise AssertionError(f"ring stuck: in flight {ring.planner.in_flight}, steps {len(ring.planner.steps)}")


def poison_udf(left: np.ndarray, right: np.ndarray, limit: int = 4) -> np.ndarray:
    """Close enough in x, and blows up on the poison value 13."""
    if (left == 13).any() or (right == 13).any():
        raise ValueError("poison")
    return np.abs(left - right) <= limit


def term_strategy(m: int):
    """(stream pair, kind, parameter) of one random predicate term."""
    pair = st.tuples(st.integers(0, m - 1), st.integers(0, m - 1)).filter(lambda p: p[0] != p[1])
    kind = st.sampled_from(["eq", "band", "udf"])
    return st.tuples(pair, kind, st.integers(0, 3))


def terms_of(spec: list) -> tuple[Term, ...]:
    """term_strategy draws -> Terms on the harness fields x (eq, udf) and y (band)."""
    out = []
    for (a, b), kind, d in spec:
        if kind == "eq":
            out.append(Term((a, "x"), (b, "x"), "eq"))
        elif kind == "band":
            out.append(Term((a, "y"), (b, "y"), "band", float(d)))
        else:
            out.append(Term((a, "x"), (b, "x"), "udf", udf_name="poison", udf=poison_udf, args={"limit": d}))
    return tuple(out)


def pair_predicate(terms: tuple[Term, ...]):
    """The reference's pair predicate: the AND of `terms` between two tuples."""
    def holds(i: int, a: ThetaTuple, j: int, b: ThetaTuple) -> bool:
        for t in terms:
            if t.streams != frozenset((i, j)):
                continue
            va = {i: np.array([a.fields[t.side(i)]]), j: np.array([b.fields[t.side(j)]])}
            if t.kind == "udf":
                try:
                    ok = bool(t.udf(va[t.left[0]], va[t.right[0]], **t.args)[0])
                except ValueError:
                    ok = False  # a failing UDF pair is no match (and its trigger is dead-lettered)
            else:
                ok = bool(t.evaluate(va)[0])
            if not ok:
                return False
        return True
    return holds
