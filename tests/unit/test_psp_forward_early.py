"""Forward before probing (engine/psp/node.py `early`): a node hands over its cross-purge
Builds and the Probe (or a passing Partial) before it probes, and what it sends in all, in
order, is what it sent in one Outbox before; the ring stays exact, and the head plans as
many rounds in flight as the cost model says when asked for "auto"."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings

from streamjoin.engine.psp import cost_model
from streamjoin.engine.psp.head import RoundPlanner
from streamjoin.engine.psp.messages import Build, Message, Partial, Probe
from streamjoin.engine.psp.node import Outbox, RingNode
from streamjoin.engine.reference import RefWindow, ThetaTuple, reference_theta_join
from tests.unit.psp_harness import make_plan, pair_predicate, run_ring
from tests.unit.test_psp_ring import scenarios
from tests.profiles import examples


def _checked(handle: Callable[..., Outbox]) -> Callable[..., Outbox]:
    """`handle` (or `release`) always called with an `early` callback, what it hands over
    checked, then passed to the caller's callback, or without one joined back into one Outbox."""
    def wrapped(node: RingNode, msg: Message, now_ms: int, early: Callable[[Outbox], None] | None = None) -> Outbox:
        ahead: list[Outbox] = []
        rest = handle(node, msg, now_ms, early=ahead.append)
        assert len(ahead) <= 1, "early is called at most once per message"
        if not ahead:
            return rest
        first = ahead[0]
        # Only what is forwarded leaves early: no probe has run yet.
        assert not first.results and not first.failures.entries and first.round_done is None
        assert all(isinstance(m, Build) for m in first.to_next[:-1])
        if first.to_next and not isinstance(first.to_next[-1], Build):
            assert first.to_next[-1] is msg and isinstance(msg, (Probe, Partial))
        if early is not None:
            early(first)
            return rest
        return Outbox(first.to_next + rest.to_next, first.direct + rest.direct, rest.results, rest.failures,
                      rest.round_done)
    return wrapped


@contextmanager
def forwarding_early() -> Iterator[None]:
    with patch.object(RingNode, "handle", _checked(RingNode.handle)), \
            patch.object(RingNode, "release", _checked(RingNode.release)):
        yield


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_ring_forwarding_early_equals_reference_join(sc: dict) -> None:
    plan = make_plan(sc["windows"], sc["terms"], sc["orders"])
    with forwarding_early():
        emitted, late, ring = run_ring(plan, sc["arrivals"], sc["layout"], sc["lateness"], sc["cuts"], sc["seed"],
                                       sc["max_in_flight"], sc["cap"], sc["relocation"], sc["resizes"])
    streams = [[ThetaTuple((f"t{a.stream}", a.part, a.off), a.ts, {"x": a.x, "y": a.y})
                for a in sc["arrivals"] if a.stream == i and (f"t{i}", a.part, a.off) not in late]
               for i in range(sc["m"])]
    expected = reference_theta_join(streams, sc["windows"], pair_predicate(sc["terms"]))
    assert len(emitted) == len(set(emitted)), "a result was produced twice"
    assert set(emitted) == expected
    assert not ring.planner.in_flight and not ring.planner.steps


def _plan(m: int):  # type: ignore[no-untyped-def]
    orders = tuple(tuple(j for j in range(m) if j != i) for i in range(m))
    return make_plan([RefWindow(range_ms=10)] * m, (), orders)


@pytest.mark.parametrize("m,n", [(2, 1), (2, 3), (3, 4), (4, 8)])
def test_auto_rounds_in_flight_follow_the_layout(m: int, n: int) -> None:
    layout = tuple(f"n{i}" for i in range(n))
    planner = RoundPlanner(_plan(m), layout)  # "auto" is the default
    assert planner.max_in_flight == cost_model.rounds_in_flight(n, m)
    planner.resize(layout + ("extra",))
    while (step := planner.step_ready()) is not None:
        planner.apply(step)
        if step.rounds:  # a passive move runs on rounds
            for _ in range(step.rounds):
                planner.on_done(planner.next_info(0, (0,) * m, 0).round)
    assert planner.layout[-1] == "extra"
    assert planner.max_in_flight == cost_model.rounds_in_flight(n + 1, m)


def test_fixed_rounds_in_flight_and_bad_values() -> None:
    assert RoundPlanner(_plan(2), ("a", "b"), 1).max_in_flight == 1
    for bad in (0, "many"):
        with pytest.raises(ValueError):
            RoundPlanner(_plan(2), ("a", "b"), bad)
