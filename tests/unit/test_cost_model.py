"""The PSP paper's cost model (section 5) against hand-computed values."""

from __future__ import annotations

import pytest

from streamjoin.engine.psp import cost_model as cm
from streamjoin.engine.psp.cost_model import Measurements

# A 3-way join seen from stream 0, which probes stream 1 then stream 2:
# lambda W of the probed streams = 20 x 3 = 60 and 5 x 4 = 20, S per step 0.1 and 0.5.
RATES, WINDOWS, SELS = [20.0, 5.0], [3.0, 4.0], [0.1, 0.5]
T_I, T_P, T_J, T_S = 1e-6, 2e-6, 1e-5, 4e-6


def test_eq1_three_streams_by_hand() -> None:
    # step 1: 1 x 60 pairs; step 2: (60 x 0.1) inputs x 20 = 120 pairs
    assert cm.probe_pairs(RATES, WINDOWS, SELS).tolist() == pytest.approx([60.0, 120.0])
    assert cm.centralized_load(T_I, T_P, T_J, RATES, WINDOWS, SELS) == pytest.approx(3e-6 + 180 * 1e-5)
    # the probe tuple plus step 1's 6 partials travel; the 60 x 0.1 x 20 x 0.5 = 60 results do not
    assert cm.ring_transfers(RATES, WINDOWS, SELS) == pytest.approx(7.0)
    assert cm.results_per_tuple(RATES, WINDOWS, SELS) == pytest.approx(60.0)
    l_c = cm.centralized_load(T_I, T_P, T_J, RATES, WINDOWS, SELS)
    assert cm.ring_load(l_c, T_S, 4, 7.0) == pytest.approx(l_c + 4e-6 * 4 * 7)


@pytest.mark.parametrize("m_streams", [2, 3, 4])
def test_eq2_is_eq1_with_equal_parameters(m_streams: int) -> None:
    rate, window, s, n = 100.0, 2.0, 0.01, 5
    rates, windows, sels = [rate] * (m_streams - 1), [window] * (m_streams - 1), [s] * (m_streams - 1)

    def general(t_i: float, t_p: float) -> float:
        l_c = cm.centralized_load(t_i, t_p, T_J, rates, windows, sels)
        return cm.ring_load(l_c, T_S, n, cm.ring_transfers(rates, windows, sels))

    def simplified(t_i: float, t_p: float) -> float:
        l_c = cm.centralized_load(t_i, t_p, T_J, rates, windows, sels)
        return cm.ring_load_simplified(l_c, T_S, T_J, rate, window, n)

    # exact without insert/purge cost; equation 2's "~=" is only those two terms
    assert general(0.0, 0.0) == pytest.approx(simplified(0.0, 0.0), rel=1e-12)
    assert general(T_I, T_P) == pytest.approx(simplified(T_I, T_P), rel=1e-3)


def test_eq3_and_eq4() -> None:
    assert cm.service_rate(0.002) == pytest.approx(500.0)
    assert cm.ring_capacity(4, 0.002) == pytest.approx(2000.0)
    # equation 4 as printed, with equation 2's L_PSP
    o_s, l_c, rate, window = 60 / 0.01, 0.01, 50.0, 10.0
    l_psp = cm.ring_load_simplified(l_c, T_S, T_J, rate, window, 3)
    printed = o_s * 3 / (1 + T_S * 3 / (rate * window * T_J))
    assert cm.output_rate(60.0, 3, l_c, l_psp) == pytest.approx(printed)


def test_eq4_output_rate_grows_with_n() -> None:
    l_c = cm.centralized_load(T_I, T_P, T_J, RATES, WINDOWS, SELS)
    rates = [cm.output_rate(60.0, n, l_c, cm.ring_load(l_c, T_S, n, 7.0)) for n in range(1, 65)]
    assert all(b > a for a, b in zip(rates, rates[1:]))
    assert rates[-1] < 60.0 / (T_S * 7.0)  # bounded by the transfer cost alone


def test_eq5_by_hand() -> None:
    # N = 4, M = 3, T_n = 2 ms: 1.5 x 2 ms + max{100/4 + 1, 3 x 4 x 2} ms
    assert cm.latency(4, 3, 0.002, 0.1, 0.001) == pytest.approx(0.003 + 0.026)
    assert cm.latency(5, 3, 0.002, 0.1, 0.001) == pytest.approx(0.004 + 0.030)


def test_eq5_minimum_matches_the_closed_form() -> None:
    m, t_n, l_c, transfer = 3, 0.002, 0.1, 0.001
    size = cm.optimal_ring_size(m, t_n, l_c, transfer, max_nodes=16)
    assert l_c / size.n1 + transfer == pytest.approx(m * size.n1 * t_n)  # first equality of 5.2
    assert (size.n2 - 1) / 2 * t_n == pytest.approx(l_c / size.n2)  # second
    assert size.n1 == pytest.approx(4.1667, abs=1e-3) and size.n2 == pytest.approx(10.51, abs=1e-2)
    assert size.closed_form == size.argmin == 4


def test_closed_form_is_clamped_to_max_nodes() -> None:
    size = cm.optimal_ring_size(3, 1e-4, 1.0, 0.0, max_nodes=4)
    assert size.n1 > 4 and size.closed_form == size.argmin == 4


def test_eq6_bandwidth() -> None:
    # smallest slice: min(100 x 2, 50 x 2) / 4 = 25 tuples; 1000 B / (1e-5 s x 25)
    assert cm.bandwidth(1000.0, 1e-5, [100.0, 50.0], [2.0, 2.0], 4) == pytest.approx(4e6)


def test_join_order_ascending_rate_window_selectivity() -> None:
    # mean edge selectivity: 0.3, 0.35, 0.15 -> keys 30, 3.5, 7.5 -> rank 1, 2, 0
    pairs = {(0, 1): 0.5, (0, 2): 0.1, (1, 2): 0.2}
    assert cm.default_join_order([100.0, 10.0, 50.0], [1.0] * 3, pairs) == ((1, 2), (2, 0), (1, 0))


def test_join_order_avoids_cross_products() -> None:
    # a chain 0 - 1 - 2 where stream 2 ranks first: from 0, stream 2 must wait for 1
    pairs = {(0, 1): 0.5, (1, 2): 0.5}
    assert cm.default_join_order([100.0, 50.0, 1.0], [1.0] * 3, pairs) == ((1, 2), (2, 0), (1, 0))


def _measurements(**over: object) -> Measurements:
    base = dict(T_j=1e-5, T_p=1e-7, T_i=1e-7, T_s=2e-6, T_n=0.002, rates=(50.0, 50.0, 50.0),
                windows=(10.0, 10.0, 10.0), orders=((1, 2), (0, 2), (1, 0)),
                selectivities=((0.1, 0.1), (0.1, 0.1), (0.1, 0.1)), tuple_bytes=100.0)
    return Measurements(**(base | over))  # type: ignore[arg-type]


def test_size_table_and_best_size() -> None:
    m = _measurements()
    rows = cm.size_table(m, 8)
    pt = cm.per_tuple(m)
    # 500 + 50 x 500 pairs per tuple, same for every arriving stream
    assert pt.l_c == pytest.approx(2e-7 + 25_500 * 1e-5) and pt.transfers == pytest.approx(51.0)
    assert [r.n for r in rows] == list(range(1, 9))
    assert all(r.keeps_up == (r.capacity >= 150.0) for r in rows)
    # 0.255 s per tuple: no N up to 8 takes 150 tuples/s, so the most capacity wins
    assert not any(r.keeps_up for r in rows) and cm.best_ring_size(rows) == 8


def test_best_size_is_least_latency_among_those_keeping_up() -> None:
    m = _measurements(T_j=1e-8)  # cheap: every N keeps up, so equation 5 decides
    rows = cm.size_table(m, 8)
    pt = cm.per_tuple(m)
    assert all(r.keeps_up for r in rows)
    assert cm.best_ring_size(rows) == cm.optimal_ring_size(3, m.T_n, pt.l_c, m.T_s * pt.transfers, 8).argmin


def test_measurements_reject_inconsistent_input() -> None:
    with pytest.raises(ValueError, match="order"):
        _measurements(orders=((1, 2), (0, 1), (1, 0)))
    with pytest.raises(ValueError, match="T_n"):
        _measurements(T_n=0.0)


def test_rounds_in_flight_keep_every_node_busy() -> None:
    # 1 + (M-1) N with a hop as long as a node's work on a round; a 2-way ring: about N
    assert [cm.rounds_in_flight(n, 2) for n in (1, 2, 4, 8)] == [2, 3, 5, 9]
    assert cm.rounds_in_flight(4, 3) == 9  # the End travels M-1 = 2 laps before a round is done
    assert cm.rounds_in_flight(8, 4) == cm.MAX_ROUNDS_IN_FLIGHT  # capped
    assert cm.rounds_in_flight(4, 2, hop_per_work=0.0) == 1  # free hops: one round keeps the ring busy
    assert cm.rounds_in_flight(4, 2, hop_per_work=0.5, cap=64) == 3
    with pytest.raises(ValueError):
        cm.rounds_in_flight(0, 2)
