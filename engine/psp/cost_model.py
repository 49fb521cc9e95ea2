"""PSP cost model (the PSP paper, section 5): equations 1-6, the latency-optimal
ring size of section 5.2, the join-order heuristic of section 5.4 and the
rounds PSP-I keeps in flight (section 4.4).

Pure: numbers in, numbers out. `services/coordinator/ring_plan.py` measures
the numbers (Table 1's terms) on the machine and job at hand.

Units: seconds, tuples, tuples/s, bytes. A probe sequence for one arriving
stream is given "in join order": `rates[k]`, `windows[k]`, `sels[k]` describe
the k-th stream it probes (k = 0 .. M-2) and that probing step's selectivity.

How our T_j maps onto the paper's nested loop. The paper assumes an in-memory
nested-loop join: every input of a probing step is compared with every tuple
of the window it probes, so step k costs T_j x (its inputs) x lambda_k W_k.
We measure T_j as the time to evaluate the job's compiled predicate terms on
one candidate pair (gathering both sides' values included): one nested-loop
comparison. For UDF predicates that is what the ring engine pays per pair
(`engine/psp/probe.py` can index nothing there). For equality and band terms
the engine narrows candidates with a sorted index first, so the model charges
every window tuple where the engine pays for a few searchsorted steps plus the
candidates that fall in the band: an upper bound on the join cost there.

Equation 1 as printed vs. as computed here. The printed join term is
T_j sum_{2<=k<=M} prod_{1<=i<=k-1} lambda_i W_i S_i. We read i as the probing
step (the i-th stream in the join order) and charge step k its candidate
pairs, (prod_{i<k} lambda_i W_i S_i) x lambda_k W_k. The printed product carries
one more factor S_k and so counts step k's outputs, not its comparisons. Only
the candidate-pair reading makes equation 2 follow from equation 1: with
equal lambda, W, S both the join term and the transfer term of L_PSP contain
the same geometric sum G = sum_{0<=k<=M-2} (lambda W S)^k, so
L_PSP - L_C = T_s N G and L_C - T_i - T_p = T_j lambda W G, hence
L_PSP = L_C (1 + T_s N / (lambda W T_j)) up to T_i + T_p; the printed product
would give T_s N / (lambda W S T_j) instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

Floats = Sequence[float]


@dataclass(frozen=True)
class Measurements:
    """Table 1's terms for one job on one machine."""

    T_j: float  # s per candidate pair: predicate evaluation, one nested-loop comparison
    T_p: float  # s per tuple purged from a slice
    T_i: float  # s per tuple inserted into a slice
    T_s: float  # s to send and receive one tuple: encode + produce + consume + decode
    T_n: float  # s, one hop's network latency
    rates: tuple[float, ...]  # lambda_i, tuples/s, per stream in job order
    windows: tuple[float, ...]  # W_i, s (count windows: rows / lambda_i)
    orders: tuple[tuple[int, ...], ...]  # per arriving stream: the streams it probes, in order
    selectivities: tuple[tuple[float, ...], ...]  # per arriving stream: S of each of its probing steps
    tuple_bytes: float  # mean encoded size of a tuple on a hop (equation 6)

    def __post_init__(self) -> None:
        m = len(self.rates)
        if len(self.windows) != m or len(self.orders) != m or len(self.selectivities) != m:
            raise ValueError("rates, windows, orders and selectivities need one entry per stream")
        for a, (order, sels) in enumerate(zip(self.orders, self.selectivities)):
            if sorted(order) != [i for i in range(m) if i != a] or len(sels) != m - 1:
                raise ValueError(f"stream {a}: the order must list the other streams once, with one S per step")
            if not all(0.0 <= s <= 1.0 for s in sels):
                raise ValueError(f"stream {a}: selectivities must lie in [0, 1], got {sels}")
        if min(self.T_j, self.T_p, self.T_i, self.T_s) < 0 or self.T_n <= 0:
            raise ValueError("times must be >= 0 and T_n > 0 (equation 5 divides by it)")
        if min(self.rates) <= 0 or min(self.windows) <= 0:
            raise ValueError("rates and windows must be > 0")

    @property
    def m(self) -> int:
        return len(self.rates)

    def probed(self, arriving: int) -> tuple[Floats, Floats, Floats]:
        """(rates, windows, selectivities) of `arriving`'s probing steps, in join order."""
        order = self.orders[arriving]
        return ([self.rates[i] for i in order], [self.windows[i] for i in order],
                self.selectivities[arriving])


# ------------------------------------------------------------ equations 1-6

def _inputs_per_step(rates: Floats, windows: Floats, sels: Floats) -> np.ndarray:
    """Tuples entering each probing step per arriving tuple: 1, then prod_{i<k} lambda_i W_i S_i."""
    fanout = np.asarray(rates, float) * np.asarray(windows, float) * np.asarray(sels, float)
    return np.concatenate(([1.0], np.cumprod(fanout)[:-1]))


def probe_pairs(rates: Floats, windows: Floats, sels: Floats) -> np.ndarray:
    """Candidate pairs of each probing step (nested loop): inputs_k x lambda_k W_k."""
    return _inputs_per_step(rates, windows, sels) * np.asarray(rates, float) * np.asarray(windows, float)


def centralized_load(T_i: float, T_p: float, T_j: float, rates: Floats, windows: Floats, sels: Floats) -> float:
    """Equation 1: L_C = T_i + T_p + T_j sum_k (prod_{i<k} lambda_i W_i S_i) lambda_k W_k,
    the time one node spends on one arriving tuple (see the module note on the product)."""
    return T_i + T_p + T_j * float(probe_pairs(rates, windows, sels).sum())


def ring_transfers(rates: Floats, windows: Floats, sels: Floats) -> float:
    """Tuples each hop carries per arriving tuple: the probe tuple plus the intermediate
    results of every step but the last, 1 + sum_{2<=k<=M-1} prod_{i<=k-1} lambda_i W_i S_i
    (final results leave the ring instead of travelling on)."""
    return float(_inputs_per_step(rates, windows, sels).sum())


def ring_load(l_c: float, T_s: float, n: int, transfers: float) -> float:
    """The general form under equation 1: L_PSP = L_C + T_s N (1 + sum ...), i.e. `transfers`."""
    return l_c + T_s * n * transfers


def ring_load_simplified(l_c: float, T_s: float, T_j: float, rate: float, window: float, n: int) -> float:
    """Equation 2 (equal lambda, W, S for all streams): L_PSP ~= L_C (1 + T_s N / (lambda W T_j))."""
    return l_c * (1.0 + T_s * n / (rate * window * T_j))


def service_rate(l_psp: float) -> float:
    """Equation 3: mu = 1 / L_PSP, arriving tuples per second for the ring's whole work per tuple.

    With N balanced, always-busy nodes each doing L_PSP / N of it (the premise of
    equation 4), the ring takes N mu tuples/s: see `ring_capacity`."""
    return 1.0 / l_psp


def ring_capacity(n: int, l_psp: float) -> float:
    """N mu: the arrival rate N balanced, always-busy nodes sustain (equation 4's premise)."""
    return n * service_rate(l_psp)


def results_per_tuple(rates: Floats, windows: Floats, sels: Floats) -> float:
    """Join results per arriving tuple: prod over all probing steps of lambda_k W_k S_k."""
    return float(np.prod(np.asarray(rates, float) * np.asarray(windows, float) * np.asarray(sels, float)))


def output_rate(results: float, n: int, l_c: float, l_psp: float) -> float:
    """Equation 4: O_PSP = O_S N / (L_PSP / L_C), with O_S = results / L_C the output rate of
    one saturated node. Equation 2 gives L_PSP / L_C = 1 + T_s N / (lambda W T_j), which is
    equation 4 as printed; the general L_PSP keeps per-stream rates, windows and selectivities."""
    o_s = results / l_c
    return o_s * n / (l_psp / l_c)


def latency(n: int, m: int, T_n: float, l_c: float, transfer: float) -> float:
    """Equation 5: tau(N) = (N - 1)/2 T_n + max{L_C / N + transfer, M N T_n}.

    `transfer` is the per-node transmission time per arriving tuple, T_s x `ring_transfers`
    = L_PSP/N - L_C/N; equation 5 writes it T_s L_C / (lambda W T_j), which is the same by
    equation 2. So the first term of the max is L_PSP / N, the balanced per-node workload."""
    return (n - 1) / 2 * T_n + max(l_c / n + transfer, m * n * T_n)


@dataclass(frozen=True)
class RingSize:
    n1: float  # root of L_C/N1 + transfer = M N1 T_n (processing meets network rounds)
    n2: float  # root of (N2 - 1)/2 T_n = L_C / N2 (position delay meets processing)
    closed_form: int  # min{N1, N2} rounded to the better neighbouring integer in 1..max_nodes
    argmin: int  # argmin of equation 5 over 1..max_nodes (smallest N on ties)


def optimal_ring_size(m: int, T_n: float, l_c: float, transfer: float, max_nodes: int) -> RingSize:
    """Section 5.2: the latency-minimising N = min{N1, N2}, solved from its two equalities
    (quadratics in N), rounded, and checked against the argmin of equation 5 over 1..max_nodes."""
    n1 = (transfer + math.sqrt(transfer ** 2 + 4 * m * T_n * l_c)) / (2 * m * T_n)
    n2 = (1 + math.sqrt(1 + 8 * l_c / T_n)) / 2
    best = min(n1, n2)
    near = sorted({min(max(k, 1), max_nodes) for k in (math.floor(best), math.ceil(best))})

    def tau(k: int) -> float:
        return latency(k, m, T_n, l_c, transfer)

    closed = min(near, key=lambda k: (tau(k), k))
    argmin = min(range(1, max_nodes + 1), key=lambda k: (tau(k), k))
    return RingSize(n1, n2, closed, argmin)


def bandwidth(tuple_bytes: float, T_j: float, rates: Floats, windows: Floats, n: int) -> float:
    """Equation 6: Band >= Tuple_Size / (T_j min_i {lambda_i W_i / N}), bytes/s, so that a hop
    delivers a tuple no slower than a node probes one against its smallest slice."""
    smallest_slice = min(r * w for r, w in zip(rates, windows)) / n
    return tuple_bytes / (T_j * smallest_slice)


# ------------------------------------------------------------ section 4.4: PSP-I

MAX_ROUNDS_IN_FLIGHT = 16  # the default's ceiling: each round in flight keeps its tuples and delayed purges


def rounds_in_flight(n: int, m: int, hop_per_work: float = 1.0, cap: int = MAX_ROUNDS_IN_FLIGHT) -> int:
    """PSP-I's threshold on rounds processed at once (the PSP paper, section 4.4: "a threshold to
    limit the number of concurrently processed stream tuples in the ring"), sized so that no
    node waits for work.

    n: ring nodes N; m: streams M; hop_per_work: one hop's latency over one node's work on one
    round (T_n over L_PSP / N for a round's tuples); cap: the most rounds to allow.

    Little's law: a node is busy all the time when the rounds in flight cover a round's cycle
    divided by its work at that node. The cycle is that work plus the M - 1 laps of N hops its
    End travels before the head may count it done (Theorem 1), so R = 1 + (M - 1) N x
    hop_per_work. The default ratio 1 is where equation 6 is just kept (a hop takes as long as
    the probing it must hide), giving about N rounds for a 2-way ring, M - 1 times that for an
    M-way one. Every round in flight keeps its tuples and its delayed purges (PSP-I's
    duplicated state), hence the cap."""
    if n < 1 or m < 2 or hop_per_work < 0 or cap < 1:
        raise ValueError(f"need n >= 1, m >= 2, hop_per_work >= 0, cap >= 1; got {n}, {m}, {hop_per_work}, {cap}")
    return max(1, min(cap, math.ceil(1 + (m - 1) * n * hop_per_work)))


HEAD_OVERHEAD = 0.1  # the head's own work per tuple over a whole window's probing (band, 16 cores)


def balanced_head_weight(n: int, overhead: float = HEAD_OVERHEAD) -> float:
    """The head's slice relative to another node's that evens out the nodes' loads.

    Every node probes a round against its slice, work P x (its share of the window); the head
    also reads, decodes, sequences, logs and releases every tuple, work D = overhead x P. Equal
    loads, f_h P + D = f_o P with f_h + (N - 1) f_o = 1, give f_h = (1 - overhead (N - 1)) / N
    and f_o = (1 + overhead) / N, so the head's weight f_h / f_o = (1 - overhead (N - 1)) /
    (1 + overhead), 0 once the head's own work alone is a fair share.

    n: ring nodes N; overhead: D / P. The default was measured with `bench band` on a 5-minute
    window on 16 cores (the weight that evened the loads at N = 2, 4 and 8); a smaller window
    has less to probe, so a larger overhead."""
    if n < 1 or overhead < 0:
        raise ValueError(f"need n >= 1 and overhead >= 0; got {n}, {overhead}")
    if n == 1:
        return 1.0
    return max(0.0, (1.0 - overhead * (n - 1)) / (1.0 + overhead))


# ------------------------------------------------------------ section 5.4

def default_join_order(rates: Floats, windows: Floats,
                       pair_selectivity: Mapping[tuple[int, int], float]) -> tuple[tuple[int, ...], ...]:
    """Section 5.4's heuristic: rank streams by lambda_i W_i avg(S_i) ascending, where avg(S_i)
    is the mean selectivity of stream i's edges in the join graph (`pair_selectivity` maps
    (i, j), i < j, to S for each pair related by a predicate term; no edge: 1).

    The paper ranks streams this way to order its per-stream ring-length computation;
    lambda_i W_i S_i is also the fan-out of probing stream i, so we probe in this rank.
    One refinement: each step takes the best-ranked stream that shares a predicate term with
    those already joined, so a cross product is only taken when nothing else is left."""
    m = len(rates)
    key = [rates[i] * windows[i] * _mean_edge_selectivity(i, pair_selectivity) for i in range(m)]
    ranked = sorted(range(m), key=lambda i: (key[i], i))
    edges = {frozenset(p) for p in pair_selectivity}
    return tuple(_order_from(a, ranked, edges) for a in range(m))


def _mean_edge_selectivity(i: int, pair_selectivity: Mapping[tuple[int, int], float]) -> float:
    mine = [s for pair, s in pair_selectivity.items() if i in pair]
    return sum(mine) / len(mine) if mine else 1.0


def _order_from(arriving: int, ranked: list[int], edges: set[frozenset[int]]) -> tuple[int, ...]:
    joined, order = {arriving}, []
    rest = [i for i in ranked if i != arriving]
    while rest:
        nxt = next((i for i in rest if any(frozenset((i, j)) in edges for j in joined)), rest[0])
        rest.remove(nxt)
        joined.add(nxt)
        order.append(nxt)
    return tuple(order)


# ------------------------------------------------------------ the model over a whole job

@dataclass(frozen=True)
class PerTuple:
    """Equation 1's loads averaged over arriving streams, weighted by their rates."""

    l_c: float  # L_C, s
    transfers: float  # tuples each hop carries per arriving tuple
    results: float  # join results per arriving tuple


def per_tuple(m: Measurements) -> PerTuple:
    weights = np.asarray(m.rates) / sum(m.rates)
    probed = [m.probed(a) for a in range(m.m)]
    l_c = [centralized_load(m.T_i, m.T_p, m.T_j, *p) for p in probed]
    return PerTuple(float(weights @ l_c), float(weights @ [ring_transfers(*p) for p in probed]),
                    float(weights @ [results_per_tuple(*p) for p in probed]))


@dataclass(frozen=True)
class SizeRow:
    n: int
    service_rate: float  # mu, equation 3
    capacity: float  # N mu, arriving tuples/s the ring sustains
    latency: float  # tau(N), equation 5, s
    output_rate: float  # equation 4, results/s when saturated
    bandwidth: float  # equation 6, bytes/s per hop
    keeps_up: bool  # capacity covers the offered load (sum of lambda_i)


def size_table(m: Measurements, max_nodes: int) -> list[SizeRow]:
    """Equations 2-6 for N = 1..max_nodes."""
    pt = per_tuple(m)
    offered = sum(m.rates)
    rows = []
    for n in range(1, max_nodes + 1):
        l_psp = ring_load(pt.l_c, m.T_s, n, pt.transfers)
        rows.append(SizeRow(
            n, service_rate(l_psp), ring_capacity(n, l_psp),
            latency(n, m.m, m.T_n, pt.l_c, m.T_s * pt.transfers),
            output_rate(pt.results, n, pt.l_c, l_psp),
            bandwidth(m.tuple_bytes, m.T_j, m.rates, m.windows, n),
            ring_capacity(n, l_psp) >= offered))
    return rows


def best_ring_size(rows: Sequence[SizeRow]) -> int:
    """The N of least equation-5 latency among those that keep up with the offered load.

    Equation 5 assumes no queueing; where the ring cannot keep up, queues (and latency)
    grow without bound, so such N only win when no N keeps up: then the N of most capacity."""
    fitting = [r for r in rows if r.keeps_up]
    if fitting:
        return min(fitting, key=lambda r: (r.latency, r.n)).n
    return max(rows, key=lambda r: (r.capacity, -r.n)).n
