"""Theorem 2 as a property: the union of a PSP ring's outputs is exactly the
reference join (none missing, none extra, none repeated), for random rings,
slicings, interleavings, resizes and predicates, and through crashes of the
whole ring at any message step (rolled back to the last checkpoint, logged
rounds released again: engine/psp/recovery.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, event, given, settings, strategies as st

from streamjoin.engine.predicates import Term
from streamjoin.engine.reference import RefWindow, ThetaTuple, reference_theta_join
from tests.unit.psp_harness import Arrival, make_plan, pair_predicate, run_ring, term_strategy, terms_of
from tests.profiles import examples


@st.composite
def scenarios(draw):
    m = draw(st.integers(2, 4))
    n_nodes = draw(st.integers(1, 5))
    windows = [RefWindow(range_ms=draw(st.integers(5, 60))) if draw(st.booleans())
               else RefWindow(rows=draw(st.integers(1, 6))) for _ in range(m)]
    terms = terms_of(draw(st.lists(term_strategy(m), max_size=3)))
    orders = tuple(tuple(draw(st.permutations([j for j in range(m) if j != i]))) for i in range(m))
    n = draw(st.integers(0, 9 if m == 4 else 14 if m == 3 else 30))
    offs = [0] * (3 * m)
    arrivals = []
    t = 0
    for _ in range(n):
        s, p = draw(st.integers(0, m - 1)), draw(st.integers(0, 2))
        t += draw(st.integers(-6, 8))
        arrivals.append(Arrival(s, max(t, 0), p, offs[s * 3 + p], draw(st.integers(10, 16)),
                                float(draw(st.integers(0, 6)))))
        offs[s * 3 + p] += 1
    layout = tuple(f"n{i}" for i in range(n_nodes))
    resizes = []
    if draw(st.booleans()):
        if n_nodes > 1 and draw(st.booleans()):
            drop = draw(st.sampled_from(layout[1:]))
            resizes.append(tuple(x for x in layout if x != drop))
        else:
            at = draw(st.integers(1, n_nodes))
            resizes.append(layout[:at] + ("new",) + layout[at:])
    return dict(m=m, windows=windows, terms=terms, orders=orders, arrivals=arrivals, layout=layout,
                lateness=draw(st.integers(0, 10)), cuts=draw(st.integers(0, 8)), seed=draw(st.integers(0, 10_000)),
                max_in_flight=draw(st.sampled_from([1, 1, 2, 4])), cap=draw(st.sampled_from([None, None, 1, 3])),
                relocation=draw(st.sampled_from(["passive", "aggressive"])), resizes=resizes)


def check_scenario(sc: dict, crash_at: frozenset[int] = frozenset(), head_weight: float | str = "auto"):
    """Run scenario `sc` (see `scenarios`) on the in-memory ring and compare with the reference."""
    plan = make_plan(sc["windows"], sc["terms"], sc["orders"])
    emitted, late, ring = run_ring(plan, sc["arrivals"], sc["layout"], sc["lateness"], sc["cuts"], sc["seed"],
                                   sc["max_in_flight"], sc["cap"], sc["relocation"], sc["resizes"], crash_at,
                                   head_weight)
    streams = [[ThetaTuple((f"t{a.stream}", a.part, a.off), a.ts, {"x": a.x, "y": a.y})
                for a in sc["arrivals"] if a.stream == i and (f"t{i}", a.part, a.off) not in late]
               for i in range(sc["m"])]
    expected = reference_theta_join(streams, sc["windows"], pair_predicate(sc["terms"]))
    assert len(emitted) == len(set(emitted)), "a result was produced twice"
    assert set(emitted) == expected, (sorted(expected - set(emitted))[:5], sorted(set(emitted) - expected)[:5])
    # Every node's slices end up holding only what the last rounds can still see.
    assert not ring.planner.in_flight and not ring.planner.steps
    return ring


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_ring_union_equals_reference_join(sc: dict) -> None:
    check_scenario(sc)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sets(st.integers(1, 300), min_size=1, max_size=3))
def test_ring_crashed_at_any_step_still_equals_reference_join(sc: dict, crash_at: set[int]) -> None:
    """Whole-ring crashes at random message steps, pipelined rounds included: exact all the same."""
    ring = check_scenario(sc, frozenset(crash_at))
    event(f"crashes: {min(ring.crashes, 2)}, rounds released again: {min(ring.redriven, 2)}")


def test_a_crash_mid_run_rolls_back_and_releases_logged_rounds_again() -> None:
    """The crash path really runs: a 3-node ring of 3 streams, 4 rounds in flight, crashed
    three times; rounds are released again and the output is still exact."""
    rng = np.random.default_rng(5)
    arrivals, offs = [], [0, 0, 0]
    for k in range(60):
        s = int(rng.integers(0, 3))
        arrivals.append(Arrival(s, 3 * k, 0, offs[s], int(rng.integers(10, 13)), float(rng.integers(0, 4))))
        offs[s] += 1
    sc = dict(m=3, windows=[RefWindow(range_ms=40), RefWindow(rows=5), RefWindow(range_ms=25)],
              terms=(Term((0, "x"), (1, "x"), "eq"), Term((1, "y"), (2, "y"), "band", 2.0)),
              orders=((1, 2), (0, 2), (1, 0)), arrivals=arrivals, layout=("n0", "n1", "n2"), lateness=0,
              cuts=12, seed=3, max_in_flight=4, cap=None, relocation="passive", resizes=[])
    ring = check_scenario(sc, frozenset({40, 90, 200}))
    assert ring.crashes == 3 and ring.redriven > 0, (ring.crashes, ring.redriven)
