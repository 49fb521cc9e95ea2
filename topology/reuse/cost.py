"""The StreamReuse paper's network-usage cost model (section 2.2), for operators that are hash-mode jobs.

Usage is bytes/s crossing between regions weighted by their latency (`QueriesSpec.latency`;
0 within a region by default), and a choice's cost is its usage per second times how long
it lasts, plus one-time transfers. What moves in our architecture:

  source pull   an operator placed in region R reads each source's whole Kafka topic from
                the source's region (a consumer cannot read a filtered topic: the cover is
                applied inside the operator), rate x tuple_bytes x latency(source, R);
                it is paid for as long as the operator lives, so widening an operator's
                lifetime pays it for the extra time;
  results       each query's compensated, projected results travel R -> its sink region:
                result rate x result bytes x latency(R, sink), for the query's lifetime;
  backfill      a new operator version re-reads its windows (max RANGE plus the
                backfill margin) of every source before its switch barrier: the source
                pull for that long, once.

Result rates of an equi-join with RANGE windows: a tuple of stream i passing its
selections (rate l_i = rate_i x selectivity_i) meets in every other stream j about
n_j / D tuples of its key, n_j = l_j x RANGE_j the window's tuples and D the composite
key's distinct values (per class the largest distinct count among its columns, as
System R estimates an equality; classes multiply), so results/s = sum_i l_i prod_j!=i n_j/D.
Selectivities come from sampled value shares per field (`frequencies`), else
len(values)/distinct. Lifetimes count from the planning instant and are capped at
`horizon_ms` (default one day): a query without a lifetime counts as running that long,
so it is never cheaper than a finite one and the numbers stay finite.

The join CPU proxy (for explain and for breaking ties between equally cheap choices) is
the tuples/s an operator reads and filters (every tuple of every source topic) plus the
window tuples its arrivals probe: sum_i l_i sum_j!=i n_j/D.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable, Mapping, Sequence

from streamjoin.schemas.query import Column, Literal_, Query, Registration
from streamjoin.settings import QueriesSpec, StreamSpec
from streamjoin.topology.reuse.operator import JoinClasses, OperatorDef, expiry, later, selection_map

DEFAULT_RATE = 100.0            # tuples/s of a stream nothing has measured
DEFAULT_DISTINCT = 100.0        # distinct values of a field nothing has measured
DEFAULT_HORIZON_MS = 86_400_000  # an unlimited lifetime counts as one day
FIELD_BYTES = {"int": 8.0, "float": 8.0, "bool": 1.0, "str": 16.0, "bytes": 32.0}
EVENT_TIME_BYTES = 8.0
MEMBER_REF_BYTES = 24.0          # per member of a result: ts, partition, offset


def _longest(op: OperatorDef) -> int:
    return max(range_ms for _, range_ms in op.range_ms)


class CostError(ValueError):
    """Statistics or a network description the cost model cannot use; says which part."""


def _finite_non_negative(value: float, what: str) -> None:
    if not math.isfinite(value) or value < 0:
        raise CostError(f"{what} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class StreamStats:
    """What the cost model knows of one source: `rate` tuples/s, `tuple_bytes` per record
    on its topic, `field_bytes` per decoded field, `frequencies` sampled value shares per
    field (value -> share of tuples), `distinct` distinct values per field."""

    rate: float
    tuple_bytes: float
    field_bytes: Mapping[str, float]
    frequencies: Mapping[str, Mapping[Hashable, float]] = field(default_factory=dict)
    distinct: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _finite_non_negative(self.rate, "rate")
        _finite_non_negative(self.tuple_bytes, "tuple_bytes")
        for name, size in self.field_bytes.items():
            _finite_non_negative(size, f"field_bytes[{name!r}]")
        for name, count in self.distinct.items():
            _finite_non_negative(count, f"distinct[{name!r}]")
        for name, shares in self.frequencies.items():
            for value, share in shares.items():
                _finite_non_negative(share, f"frequencies[{name!r}][{value!r}]")

    def distinct_of(self, field_name: str) -> float:
        """Distinct values of `field_name` (at least 1)."""
        return max(self.distinct.get(field_name, DEFAULT_DISTINCT), 1.0)

    def share(self, field_name: str, values: frozenset[Literal_]) -> float:
        """The fraction of tuples whose `field_name` is one of `values`.

        A value the sample never saw gets an even part of the share the sample leaves
        unexplained, spread over the distinct values it did not see."""
        sampled = self.frequencies.get(field_name)
        if not sampled:
            return min(len(values) / self.distinct_of(field_name), 1.0)
        unseen = [v for v in values if v not in sampled]
        share = sum(sampled.get(v, 0.0) for v in values)
        if unseen:
            rest = max(1.0 - sum(sampled.values()), 0.0)
            share += len(unseen) * rest / max(self.distinct_of(field_name) - len(sampled), 1.0)
        return min(share, 1.0)

    def bytes_of(self, field_name: str) -> float:
        """Bytes one value of `field_name` takes in a result."""
        return self.field_bytes.get(field_name, FIELD_BYTES["str"])


@dataclass(frozen=True)
class Statistics:
    """Per-stream statistics (stream name -> StreamStats)."""

    streams: Mapping[str, StreamStats]

    @classmethod
    def defaults(cls, specs: Sequence[StreamSpec], rate: float = DEFAULT_RATE,
                 distinct: float = DEFAULT_DISTINCT) -> "Statistics":
        """Guesses for streams nothing has measured: `rate` tuples/s each, field sizes by type
        (FIELD_BYTES; a record is the sum of its fields), `distinct` values per field and
        uniform value shares."""
        streams = {}
        for spec in specs:
            sizes = {name: FIELD_BYTES[kind] for name, kind in spec.fields.items()}
            streams[spec.name] = StreamStats(rate=rate, tuple_bytes=sum(sizes.values()), field_bytes=sizes,
                                             distinct={name: distinct for name in spec.fields})
        return cls(streams=streams)

    def of(self, stream: str) -> StreamStats:
        """`stream`'s statistics. Raises CostError for a stream with none."""
        try:
            return self.streams[stream]
        except KeyError:
            raise CostError(f"no statistics for stream {stream!r} (known: {sorted(self.streams)})") from None


@dataclass(frozen=True)
class Network:
    """Regions, the latency weight between any two, and where each source's producers are."""

    regions: tuple[str, ...]
    latency_ms: tuple[tuple[float, ...], ...]
    source_regions: Mapping[str, str]

    @classmethod
    def from_spec(cls, spec: QueriesSpec) -> "Network":
        """The network `spec` describes (QueriesSpec.latency for every pair of regions)."""
        regions = tuple(spec.regions)
        matrix = tuple(tuple(spec.latency(a, b) for b in regions) for a in regions)
        return cls(regions=regions, latency_ms=matrix, source_regions=dict(spec.source_regions))

    def index(self, region: str) -> int:
        """`region`'s position. Raises CostError for an unknown region."""
        try:
            return self.regions.index(region)
        except ValueError:
            raise CostError(f"unknown region {region!r} (regions: {list(self.regions)})") from None

    def latency(self, a: str, b: str) -> float:
        """The latency weight between regions `a` and `b`."""
        return self.latency_ms[self.index(a)][self.index(b)]

    def bit(self, region: str) -> int:
        """`region`'s RID bit (the StreamReuse paper, section 4.2): `1 << index`."""
        return 1 << self.index(region)

    @property
    def all_bits(self) -> int:
        """The NID mask of every region."""
        return (1 << len(self.regions)) - 1

    def source_region(self, stream: str) -> str:
        """Where `stream`'s topic is produced (the first region unless configured)."""
        return self.source_regions.get(stream, self.regions[0])


@dataclass(frozen=True)
class CandidateCost:
    """One choice's cost numbers: usage per second of the source pull it adds and of the
    query's results (bytes/s x latency), the seconds each is paid for, the one-time
    backfill (bytes x latency), their `total`, and the join CPU proxy it adds (tuples/s;
    negative when it narrows an operator; None when the planner had no need to work it out:
    the choice was dearer in network cost than the best one)."""

    pull_per_s: float
    pull_s: float
    results_per_s: float
    results_s: float
    backfill: float
    cpu_delta: float | None

    @property
    def total(self) -> float:
        return self.pull_per_s * self.pull_s + self.results_per_s * self.results_s + self.backfill

    def to_json(self) -> dict[str, float | None]:
        return {"total": self.total, "pull_per_s": self.pull_per_s, "pull_s": self.pull_s,
                "results_per_s": self.results_per_s, "results_s": self.results_s,
                "backfill": self.backfill, "cpu_delta_tuples_per_s": self.cpu_delta}


class CostModel:
    """Network usage and join CPU of operators and queries (module docstring).

    network: regions and latencies; stats: per-stream statistics (read as fixed: figures
    derived from them are remembered); horizon_ms: how long an unlimited (or longer)
    lifetime counts; backfill_margin_ms: what a new version reads beyond its windows
    (QueriesSpec.backfill_margin_ms)."""

    def __init__(self, network: Network, stats: Statistics, horizon_ms: int = DEFAULT_HORIZON_MS,
                 backfill_margin_ms: int = 0) -> None:
        if horizon_ms <= 0:
            raise CostError(f"horizon_ms must be positive, got {horizon_ms}")
        self.network = network
        self.stats = stats
        self.horizon_ms = horizon_ms
        self.backfill_margin_ms = backfill_margin_ms
        self._pull_usage: dict[tuple[tuple[str, ...], str], float] = {}
        self._distinct: dict[JoinClasses, float] = {}

    # ---------------------------------------------------------------- rates

    def _filtered_rates(self, sources: Sequence[str],
                        allowed: Mapping[Column, frozenset[Literal_]]) -> dict[str, float]:
        """Per source, tuples/s passing the selections `allowed` (independent across fields)."""
        rates = {stream: self.stats.of(stream).rate for stream in sources}
        for column, values in allowed.items():
            rates[column.stream] *= self.stats.of(column.stream).share(column.field, values)
        return rates

    def _key_distinct(self, classes: JoinClasses) -> float:
        """Distinct values of the composite key (remembered per join classes)."""
        distinct = self._distinct.get(classes)
        if distinct is None:
            distinct = math.prod(max(self.stats.of(c.stream).distinct_of(c.field) for c in members)
                                 for members in classes)
            self._distinct[classes] = distinct
        return distinct

    def _window_matches(self, sources: Sequence[str], ranges: Mapping[str, int], classes: JoinClasses,
                        allowed: Mapping[Column, frozenset[Literal_]]) -> tuple[dict[str, float], dict[str, float]]:
        """Per source: filtered rate, and the tuples of its window one arrival of another
        stream finds with its key."""
        rates = self._filtered_rates(sources, allowed)
        distinct = self._key_distinct(classes)
        matches = {stream: rates[stream] * ranges[stream] / 1000.0 / distinct for stream in sources}
        return rates, matches

    def result_rate(self, query: Query) -> float:
        """Estimated results/s of `query` run alone (its selections and RANGEs)."""
        sources = sorted(query.sources)
        ranges = {w.stream: w.range_ms for w in query.windows}
        rates, matches = self._window_matches(sources, ranges, query.join_classes, selection_map(query.selections))
        return sum(rates[i] * math.prod(matches[j] for j in sources if j != i) for i in sources)

    def result_bytes(self, query: Query) -> float:
        """Bytes of one of `query`'s results: event time, each member's ref, its SELECT list."""
        selected = sum(self.stats.of(c.stream).bytes_of(c.field) for c in query.columns)
        return EVENT_TIME_BYTES + MEMBER_REF_BYTES * len(query.sources) + selected

    def cpu(self, op: OperatorDef) -> float:
        """The join CPU proxy of `op` in tuples/s: every source tuple read and filtered, plus
        the window tuples probed by the arrivals that pass the cover."""
        return self.join_cpu(op.sources, op.join_classes, dict(op.range_ms), op.cover())

    def join_cpu(self, sources: Sequence[str], classes: JoinClasses, ranges: Mapping[str, int],
                 cover: Mapping[Column, frozenset[Literal_]]) -> float:
        """`cpu` of an operator given by its parts (no definition needs building to price one)."""
        read = sum(self.stats.of(stream).rate for stream in sources)
        rates, matches = self._window_matches(sources, ranges, classes, cover)
        probed = sum(rates[i] * sum(matches[j] for j in sources if j != i) for i in sources)
        return read + probed

    # ---------------------------------------------------------------- usage

    def pull_usage(self, sources: Sequence[str], region: str) -> float:
        """Bytes/s x latency of reading the whole topics of `sources` into `region`
        (remembered per sources and region: planning asks it once per candidate)."""
        key = (tuple(sources), region)
        usage = self._pull_usage.get(key)
        if usage is None:
            usage = sum(self.stats.of(s).rate * self.stats.of(s).tuple_bytes
                        * self.network.latency(self.network.source_region(s), region) for s in sources)
            self._pull_usage[key] = usage
        return usage

    def results_bytes_per_s(self, reg: Registration) -> float:
        """Bytes/s of `reg`'s results (whatever operator computes them: compensation makes
        them the query's own)."""
        return self.result_rate(reg.query) * self.result_bytes(reg.query)

    def results_usage(self, reg: Registration, region: str, flow: float | None = None) -> float:
        """Bytes/s x latency of `reg`'s results travelling from `region` to its sink region
        (`flow`: `results_bytes_per_s(reg)` when the caller has it)."""
        flow = self.results_bytes_per_s(reg) if flow is None else flow
        return flow * self.network.latency(region, reg.region)

    def remaining_s(self, expires_ms: int | None, now_ms: int) -> float:
        """Seconds from `now_ms` until `expires_ms` (None = unlimited), capped at the horizon."""
        if expires_ms is None:
            return self.horizon_ms / 1000.0
        return min(max(expires_ms - now_ms, 0), self.horizon_ms) / 1000.0

    def backfill(self, sources: Sequence[str], region: str, longest_range_ms: int) -> float:
        """Bytes x latency a new operator version in `region` reads before its barrier: its
        longest window plus the margin, of every source topic."""
        return self.pull_usage(sources, region) * (longest_range_ms + self.backfill_margin_ms) / 1000.0

    # ---------------------------------------------------------------- choices

    def _query_seconds(self, reg: Registration) -> float:
        return self.remaining_s(expiry(reg), reg.registered_ms)

    def fresh(self, op: OperatorDef, reg: Registration, flow: float | None = None) -> CandidateCost:
        """Cost of deploying `op` (a fresh operator for `reg` alone); `flow` as in `results_usage`."""
        seconds = self._query_seconds(reg)
        return CandidateCost(pull_per_s=self.pull_usage(op.sources, op.region), pull_s=seconds,
                             results_per_s=self.results_usage(reg, op.region, flow), results_s=seconds,
                             backfill=self.backfill(op.sources, op.region, _longest(op)), cpu_delta=self.cpu(op))

    def reuse(self, currents: Sequence[OperatorDef], reg: Registration, unchanged: Sequence[bool],
              flow: float | None = None) -> list[CandidateCost]:
        """Incremental network cost of serving `reg` from each operator of `currents`, as it
        is (`unchanged[i]`: it answers the query) or relaxed: its results from the operator's
        region, the source pull for the lifetime relaxation adds, and a relaxed version's
        backfill. The other queries' results are unchanged by construction, so they do not
        count. Needs no relaxed definition: the lifetime and longest window it would have
        follow from the two. cpu_delta is 0 where unchanged and None (not worked out) where
        relaxed. The query's own figures are worked out once, so a candidate costs a few lookups.

        flow: as in `results_usage`."""
        flow = self.results_bytes_per_s(reg) if flow is None else flow
        now, wanted = reg.registered_ms, expiry(reg)
        query_s = self.remaining_s(wanted, now)
        query_longest = max(w.range_ms for w in reg.query.windows)
        to_sink = {region: flow * self.network.latency(region, reg.region) for region in self.network.regions}
        costs = []
        for current, same in zip(currents, unchanged):
            pull = self.pull_usage(current.sources, current.region)
            results = to_sink[current.region]
            if same:
                costs.append(CandidateCost(pull, 0.0, results, query_s, 0.0, 0.0))
                continue
            held_s = self.remaining_s(current.expires_ms, now)
            added_s = self.remaining_s(later(current.expires_ms, wanted), now) - held_s
            longest = max(_longest(current), query_longest)
            backfill = pull * (longest + self.backfill_margin_ms) / 1000.0  # `backfill`, with the pull at hand
            costs.append(CandidateCost(pull, added_s, results, query_s, backfill, None))
        return costs

    def keep(self, op: OperatorDef, now_ms: int) -> CandidateCost:
        """Cost of running `op` unchanged from `now_ms` until it expires (its source pull)."""
        return CandidateCost(pull_per_s=self.pull_usage(op.sources, op.region),
                             pull_s=self.remaining_s(op.expires_ms, now_ms), results_per_s=0.0, results_s=0.0,
                             backfill=0.0, cpu_delta=0.0)

    def narrow(self, current: OperatorDef, narrower: OperatorDef, now_ms: int) -> CandidateCost:
        """Cost of switching `current` to `narrower` at `now_ms` and running it until it
        expires: its source pull, a backfill, and the join CPU it saves (negative delta)."""
        sources, region = narrower.sources, narrower.region
        return CandidateCost(pull_per_s=self.pull_usage(sources, region),
                             pull_s=self.remaining_s(narrower.expires_ms, now_ms), results_per_s=0.0, results_s=0.0,
                             backfill=self.backfill(sources, region, _longest(narrower)),
                             cpu_delta=self.cpu(narrower) - self.cpu(current))
