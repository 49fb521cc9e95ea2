"""The head's slice (engine/psp/head.py slice_bounds, cost_model.balanced_head_weight): the
head reads, sequences and logs every tuple besides probing, so it keeps a smaller slice; the
weight evens the nodes' loads, follows resizes when "auto", and leaves the ring exact."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamjoin.engine.psp import cost_model
from streamjoin.engine.psp.head import RoundPlanner, slice_bounds
from streamjoin.engine.reference import RefWindow
from tests.unit.psp_harness import make_plan
from tests.unit.test_psp_ring import check_scenario, scenarios
from tests.profiles import examples

SIZE = 1000


def _plan():  # type: ignore[no-untyped-def]
    return make_plan([RefWindow(range_ms=SIZE)] * 2, (), ((1,), (0,)))


def _widths(bounds: dict[str, tuple[float, ...]], layout: tuple[str, ...]) -> list[float]:
    """Each node's slice width on stream 0, in layout order."""
    edges = [0.0] + [bounds[n][0] for n in layout]
    return [b - a for a, b in zip(edges, edges[1:])]


@given(n=st.integers(1, 12), weight=st.floats(0.0, 1.0))
def test_the_head_keeps_weight_times_another_nodes_slice(n: int, weight: float) -> None:
    layout = tuple(f"n{i}" for i in range(n))
    bounds = slice_bounds(_plan(), layout, head_weight=weight)
    widths = _widths(bounds, layout)
    assert bounds[layout[-1]] == (SIZE, SIZE), "the last node's bound is the whole window, exactly"
    assert all(w >= 0 for w in widths)
    if n == 1:
        assert widths == [SIZE]
    else:
        others = widths[1:]
        assert max(others) - min(others) < 1e-6 * SIZE
        assert widths[0] == pytest.approx(weight * others[0], abs=1e-6 * SIZE)


def test_a_dropped_node_keeps_nothing_whatever_the_head_weight() -> None:
    layout = ("h", "a", "b")
    bounds = slice_bounds(_plan(), layout, frozenset({"a"}), head_weight=0.5)
    assert _widths(bounds, layout) == pytest.approx([SIZE / 3, 0.0, 2 * SIZE / 3])


@given(n=st.integers(2, 16), overhead=st.floats(0.0, 0.5))
def test_balanced_weight_evens_the_loads(n: int, overhead: float) -> None:
    """Load = share of the window probed (P = 1) plus, at the head, `overhead`: equal at every
    node unless the head's own work alone exceeds a fair share (then it keeps nothing)."""
    layout = tuple(f"n{i}" for i in range(n))
    weight = cost_model.balanced_head_weight(n, overhead)
    shares = [w / SIZE for w in _widths(slice_bounds(_plan(), layout, head_weight=weight), layout)]
    head, others = shares[0] + overhead, shares[1:]
    if weight > 0:
        assert head == pytest.approx(others[0], abs=1e-9)
    else:
        assert overhead * (n - 1) >= 1 - 1e-9 and head >= others[0]


def test_balanced_weight_values_and_bad_input() -> None:
    assert cost_model.balanced_head_weight(1) == 1.0
    assert cost_model.balanced_head_weight(4, 0.0) == 1.0
    assert cost_model.balanced_head_weight(2, 0.1) == pytest.approx(0.9 / 1.1)
    assert cost_model.balanced_head_weight(12, 0.1) == 0.0
    for n, overhead in ((0, 0.1), (2, -0.1)):
        with pytest.raises(ValueError):
            cost_model.balanced_head_weight(n, overhead)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "half", None, float("nan")])
def test_planner_rejects_a_bad_head_weight(bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="head_weight"):
        RoundPlanner(_plan(), ("h", "a"), head_weight=bad)


def test_auto_head_weight_follows_a_resize() -> None:
    planner = RoundPlanner(_plan(), ("h", "a"))  # "auto" is the default
    assert _widths(planner.bounds, ("h", "a"))[0] == pytest.approx(
        SIZE * cost_model.balanced_head_weight(2) / (1 + cost_model.balanced_head_weight(2)))
    wide = ("h", "a", "b", "c")
    planner.resize(wide)
    while (step := planner.step_ready()) is not None:
        planner.apply(step)
        while planner._moved < planner._span:  # a passive move runs on rounds: run them
            planner.on_done(planner.next_info(0, (0, 0), 0).round)
    assert planner.layout == wide
    assert planner.bounds == slice_bounds(_plan(), wide, head_weight=cost_model.balanced_head_weight(4))


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios(), weight=st.sampled_from([0.0, 0.3, 1.0]))
def test_a_ring_with_a_light_head_equals_the_reference(sc: dict, weight: float) -> None:
    """Theorem 2 holds for any slice widths: the head keeping little or nothing changes where
    tuples are probed, not which pairs meet (random rings, resizes, rounds in flight)."""
    check_scenario(sc, head_weight=weight)
