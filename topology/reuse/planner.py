"""The reuse planner (the StreamReuse paper, sections 2.2-4): for each new query, reuse an operator as
it is, relax one, or deploy a fresh one near the sink, whichever the cost model finds
cheapest; narrow or remove operators as queries leave.

Modes (`QueriesSpec.reuse`): "none" always deploys fresh; "exact" considers only the
operators that answer the query unchanged; "relax" considers every operator passing the
base conditions, each at its minimal relaxation. Candidates come from the reuse lattice
with every region in the mask: locality is the cost model's to weigh, not a filter.

Choosing: the lowest total network cost (cost.py) wins; equal totals (operators in the
sinks' own region cost 0 with the default latencies) go to reuse without change, then to
the least join CPU added, then relaxation over a fresh operator, then the first id sorted.

Planning one query costs two lattice searches (base conditions; reuse without change),
an O(1) network cost per candidate (the relaxed lifetime and window follow from the
operator and the query, and a query's results cost the same from any operator in a
region), and a relaxation with its join CPU only for the candidates tied at the lowest
network cost. Each is a function of the operator's definition and its kept CPU figure:
nothing walks the queries an operator already serves (a drop folds them, once).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal, Mapping, Sequence

from streamjoin.schemas.query import Registration
from streamjoin.settings import QueriesSpec, StreamSpec
from streamjoin.topology.reuse.compensation import Compensation, compensation
from streamjoin.topology.reuse.cost import DEFAULT_HORIZON_MS, CandidateCost, CostModel, Network, Statistics
from streamjoin.topology.reuse.lattice import ReuseLattice
from streamjoin.topology.reuse.operator import (
    OperatorDef, OperatorError, fold, for_query, relax, relaxed_cover, relaxed_ranges, sorted_values,
)

Kind = Literal["exact", "relax", "new", "narrow", "remove"]
_PREFERENCE = {"exact": 0, "relax": 1, "new": 2}


class PlanningError(ValueError):
    """A registration or decision the planner cannot take; says why."""


class UnknownQueryError(PlanningError):
    """No query with that id is registered."""


@dataclass(frozen=True)
class Decision:
    """What the planner decided for one query (or one drop).

    kind: exact (reuse unchanged), relax (widen then reuse), new (fresh operator), narrow,
    remove; operator: the operator's id; definition: its definition after the decision
    (None for remove); previous: before it (None for new); compensation: the query's (None
    for drops); costs: total cost per option (operator id, or `new@<region>` for a fresh
    one); candidates: operators the lattice offered; planning_ms: time spent; reason: the
    decision in words; breakdown: each option's cost numbers; query: the query's id."""

    kind: Kind
    operator: str
    definition: OperatorDef | None
    previous: OperatorDef | None
    compensation: Compensation | None
    costs: dict[str, float]
    candidates: int
    planning_ms: float
    reason: str
    breakdown: dict[str, dict[str, float | None]] = field(default_factory=dict)
    query: str = ""

    def explain(self) -> dict[str, object]:
        """The decision as JSON-able values: what changed per part of the operator, the
        query's compensation and every option's cost numbers."""
        return {
            "query": self.query,
            "kind": self.kind,
            "operator": self.operator,
            "reason": self.reason,
            "candidates": self.candidates,
            "planning_ms": self.planning_ms,
            "definition": None if self.definition is None else self.definition.to_json(),
            "previous": None if self.previous is None else self.previous.to_json(),
            "relaxation": relaxation(self.previous, self.definition),
            "compensation": None if self.compensation is None else self.compensation.to_json(),
            "costs": {name: self.breakdown.get(name, {"total": total}) for name, total in self.costs.items()},
        }


def relaxation(previous: OperatorDef | None, definition: OperatorDef | None) -> dict[str, object]:
    """Per part (selection, projection, window, lifetime), what changed from `previous` to
    `definition`; an unconstrained column shows as None. Empty when either is missing."""
    if previous is None or definition is None:
        return {}
    before, after = previous.cover(), definition.cover()

    def shown(values: frozenset | None) -> list | None:
        return None if values is None else sorted_values(values)

    selection = {str(c): {"before": shown(before.get(c)), "after": shown(after.get(c))}
                 for c in sorted(set(before) | set(after)) if before.get(c) != after.get(c)}
    old_columns, new_columns = set(previous.columns), set(definition.columns)
    old_ranges, new_ranges = dict(previous.range_ms), dict(definition.range_ms)
    return {
        "selection": selection,
        "projection": {"added": [str(c) for c in sorted(new_columns - old_columns)],
                       "removed": [str(c) for c in sorted(old_columns - new_columns)]},
        "window": {"range_ms": {s: {"before": old_ranges[s], "after": new_ranges[s]}
                                for s in definition.sources if old_ranges[s] != new_ranges[s]},
                   "slide_ms": {"before": previous.slide_ms, "after": definition.slide_ms}},
        "lifetime": {"expires_ms": {"before": previous.expires_ms, "after": definition.expires_ms}},
    }


@dataclass(frozen=True)
class OperatorState:
    """A deployed operator: its current definition, its version (incremented by every
    relaxation or narrowing, each a switch at a barrier) and the ids of its queries."""

    definition: OperatorDef
    version: int
    queries: tuple[str, ...]


@dataclass(frozen=True)
class _Option:
    """One way to serve a query, `name`d as in Decision.costs. `definition` is None for a
    relaxation not yet worked out."""

    name: str
    kind: Kind
    operator: str
    definition: OperatorDef | None
    previous: OperatorDef | None
    cost: CandidateCost

    def rank(self) -> tuple[float, int, float, int]:
        """Network total, then reuse without change, then join CPU added, then relax over new."""
        cpu = self.cost.cpu_delta
        return (self.cost.total, self.kind != "exact", float("inf") if cpu is None else cpu, _PREFERENCE[self.kind])


class Planner:
    """Plans and records queries onto shared operators (module docstring).

    spec: the query service's settings (regions, latencies, mode, backfill margin);
    streams: the catalog queries may name; stats: their statistics; horizon_ms: how long an
    unlimited lifetime counts in costs."""

    def __init__(self, spec: QueriesSpec, streams: Sequence[StreamSpec], stats: Statistics,
                 horizon_ms: int = DEFAULT_HORIZON_MS) -> None:
        self.spec = spec
        self._catalog = {stream.name: stream for stream in streams}
        self._network = Network.from_spec(spec)
        self.costs = CostModel(self._network, stats, horizon_ms, spec.backfill_margin_ms)
        self._lattice = ReuseLattice()
        self._operators: dict[str, OperatorState] = {}
        self._registrations: dict[str, Registration] = {}
        self._assigned: dict[str, str] = {}
        self._cpu: dict[str, float] = {}  # per operator: its join CPU proxy, kept so planning need not redo it
        self._next_id = 1

    # ---------------------------------------------------------------- reading

    def operators(self) -> Mapping[str, OperatorState]:
        """The deployed operators by id (a read-only live view)."""
        return MappingProxyType(self._operators)

    def registration(self, query_id: str) -> Registration:
        """The registration of `query_id`. Raises UnknownQueryError."""
        try:
            return self._registrations[query_id]
        except KeyError:
            raise UnknownQueryError(f"no query {query_id!r} is registered") from None

    def operator_of(self, query_id: str) -> str:
        """The id of the operator serving `query_id`. Raises UnknownQueryError."""
        self.registration(query_id)
        return self._assigned[query_id]

    def compensation(self, query_id: str) -> Compensation:
        """`query_id`'s compensation on its operator's current definition. Raises UnknownQueryError."""
        reg = self.registration(query_id)
        return compensation(self._operators[self._assigned[query_id]].definition, reg)

    # ---------------------------------------------------------------- planning

    def _validate(self, reg: Registration) -> None:
        """Raise PlanningError unless `reg` names known regions, streams and fields and is new."""
        if reg.id in self._registrations:
            raise PlanningError(f"query {reg.id!r} is already registered")
        if reg.region not in self._network.regions:
            raise PlanningError(f"region {reg.region!r} is not one of {list(self._network.regions)}")
        if reg.lifetime_ms is not None and reg.lifetime_ms <= 0:
            raise PlanningError(f"lifetime_ms must be positive, got {reg.lifetime_ms}")
        query = reg.query
        unknown = sorted(query.sources - set(self._catalog))
        if unknown:
            raise PlanningError(f"streams {unknown} are not in the catalog {sorted(self._catalog)}")
        unmeasured = sorted(query.sources - set(self.costs.stats.streams))
        if unmeasured:
            raise PlanningError(f"streams {unmeasured} have no statistics")
        named = list(query.columns) + [s.column for s in query.selections]
        named += [c for pair in query.joins for c in pair]
        missing = sorted({str(c) for c in named
                          if c.stream in self._catalog and c.field not in self._catalog[c.stream].fields})
        if missing:
            raise PlanningError(f"columns {missing} are not fields of their streams")

    def _fresh(self, reg: Registration, flow: float) -> _Option:
        try:
            definition = for_query(reg, reg.region)
        except OperatorError as error:
            raise PlanningError(f"query {reg.id!r}: {error}") from None
        return _Option(f"new@{reg.region}", "new", f"op-{self._next_id}", definition, None,
                       self.costs.fresh(definition, reg, flow))

    def _candidates(self, reg: Registration, flow: float) -> list[_Option]:
        """The operators the lattice offers (every region), each priced in network cost."""
        if self.spec.reuse == "none":
            return []
        regions = self._network.all_bits
        unchanged = self._lattice.search(reg, regions=regions, relax=False)
        found = self._lattice.search(reg, regions=regions, relax=True) if self.spec.reuse == "relax" else unchanged
        answering = set(unchanged)
        currents = [self._operators[op_id].definition for op_id in found]
        exact = [op_id in answering for op_id in found]
        costs = self.costs.reuse(currents, reg, exact, flow)
        return [_Option(op_id, "exact" if same else "relax", op_id, current if same else None, current, cost)
                for op_id, current, same, cost in zip(found, currents, exact, costs)]

    def _cpu_priced(self, option: _Option, reg: Registration) -> _Option:
        """`option` with the join CPU its relaxation adds (from the relaxed cover and windows
        alone: building the relaxed definition waits until it is chosen)."""
        if option.cost.cpu_delta is not None:
            return option
        current, query = option.previous, reg.query
        assert current is not None  # only reuse options lack a CPU figure
        widened_cpu = self.costs.join_cpu(current.sources, current.join_classes, relaxed_ranges(current, query),
                                          relaxed_cover(current.cover(), query))
        return replace(option, cost=replace(option.cost, cpu_delta=widened_cpu - self._cpu[option.operator]))

    def plan(self, reg: Registration) -> Decision:
        """Decide how to serve `reg` (nothing is recorded: see `apply`).

        Raises PlanningError when the registration is invalid or hash mode cannot run it."""
        started = time.perf_counter()
        self._validate(reg)
        flow = self.costs.results_bytes_per_s(reg)  # the query's own results, whichever operator computes them
        fresh = self._fresh(reg, flow)
        options = [fresh] + self._candidates(reg, flow)
        cheapest = min(option.cost.total for option in options)
        # Only the options tied at the lowest network cost need their relaxation worked out.
        tied = [option for option in options if option.cost.total <= cheapest]
        exact = [option for option in tied if option.kind == "exact"]
        worked = exact[:1] or [self._cpu_priced(option, reg) for option in tied]
        chosen = min(worked, key=_Option.rank)  # ties keep the first: the fresh option, then ids as sorted
        if chosen.definition is None:
            chosen = replace(chosen, definition=relax(chosen.previous, reg))  # type: ignore[arg-type]
        shown = {option.name: option for option in options} | {option.name: option for option in worked}
        return Decision(
            kind=chosen.kind, operator=chosen.operator, definition=chosen.definition, previous=chosen.previous,
            compensation=compensation(chosen.definition, reg),
            costs={name: option.cost.total for name, option in shown.items()}, candidates=len(options) - 1,
            planning_ms=(time.perf_counter() - started) * 1000.0,
            reason=self._reason(chosen, fresh, options),
            breakdown={name: option.cost.to_json() for name, option in shown.items()}, query=reg.id)

    def _reason(self, chosen: _Option, fresh: _Option, options: Sequence[_Option]) -> str:
        fresh_text = f"a fresh operator in {fresh.definition.region} ({fresh.cost.total:.6g})"
        if self.spec.reuse == "none":
            return f"reuse is off (queries.reuse = none): {fresh_text}"
        if chosen.kind == "new":
            reused = [o for o in options if o.kind != "new"]
            if not reused:
                missing = "answers it unchanged" if self.spec.reuse == "exact" else "shares its sources and joins"
                return f"no operator {missing}: {fresh_text}"
            best = min(reused, key=_Option.rank)
            return f"{fresh_text} is cheaper than the best reuse, {best.operator} ({best.cost.total:.6g})"
        verb = "reusing" if chosen.kind == "exact" else "relaxing"
        return f"{verb} {chosen.operator} ({chosen.cost.total:.6g}) is not dearer than {fresh_text}"

    # ---------------------------------------------------------------- recording

    def apply(self, reg: Registration, decision: Decision) -> None:
        """Record `decision` (from `plan(reg)`): deploy, widen or share the operator.

        Raises PlanningError when the decision is for another query, is a drop's, or is
        stale (the operator changed, or its id was taken, since it was planned)."""
        if decision.query != reg.id or decision.kind in ("narrow", "remove") or decision.definition is None:
            raise PlanningError(f"decision {decision.kind} for {decision.query!r} does not register {reg.id!r}")
        self._validate(reg)
        if decision.kind == "new":
            if decision.operator != f"op-{self._next_id}":
                raise PlanningError(f"stale decision: operator id {decision.operator!r} is no longer the next one")
            self._next_id += 1
            self._set(decision.operator, OperatorState(decision.definition, 1, (reg.id,)))
        else:
            state = self._operators.get(decision.operator)
            if state is None or state.definition != decision.previous:
                raise PlanningError(f"stale decision: operator {decision.operator!r} changed since it was planned")
            version = state.version + 1 if decision.kind == "relax" else state.version
            self._set(decision.operator, OperatorState(decision.definition, version, state.queries + (reg.id,)))
        self._registrations[reg.id] = reg
        self._assigned[reg.id] = decision.operator

    def _set(self, op_id: str, state: OperatorState) -> None:
        """Store `state` for `op_id`, re-indexing it when its definition changed."""
        previous = self._operators.get(op_id)
        if previous is None or previous.definition != state.definition:
            if previous is not None:
                self._lattice.remove(op_id)
            self._lattice.add(op_id, state.definition, self._network.bit(state.definition.region))
            self._cpu[op_id] = self.costs.cpu(state.definition)
        self._operators[op_id] = state

    def restore(self, states: Mapping[str, OperatorState], registrations: Sequence[Registration],
                next_id: int) -> None:
        """Replace everything recorded with `states` (operator id -> state, as read back from
        the durable registry) and the running `registrations`; new operators get ids from
        `op-<next_id>` on.

        Raises PlanningError when a registration is on no operator, on two, or an operator
        lists a query that is not among `registrations`."""
        by_id = {reg.id: reg for reg in registrations}
        listed = [(query_id, op_id) for op_id, state in states.items() for query_id in state.queries]
        assigned = dict(listed)
        if len(assigned) != len(listed):
            raise PlanningError("a query is listed on two operators")
        if set(assigned) != set(by_id):
            raise PlanningError(f"queries on no operator: {sorted(set(by_id) - set(assigned))}; operators' queries "
                                f"not registered: {sorted(set(assigned) - set(by_id))}")
        self._lattice = ReuseLattice()
        self._operators, self._cpu = {}, {}
        for op_id, state in states.items():
            self._set(op_id, state)
        self._registrations, self._assigned = by_id, assigned
        self._next_id = max(next_id, 1)

    def drop(self, query_id: str, now_ms: int | None = None) -> Decision | None:
        """Remove `query_id` and say what happens to its operator: "remove" when no query
        is left on it, "narrow" when folding the remaining queries gives a strictly
        narrower definition that is cheaper by (network cost from `now_ms` including the
        switch's backfill, then join CPU), None when it stays as it is.

        now_ms: the instant costs count from (None = the wall clock). Raises UnknownQueryError."""
        started = time.perf_counter()
        self.registration(query_id)
        now = int(time.time() * 1000) if now_ms is None else now_ms
        op_id = self._assigned.pop(query_id)
        del self._registrations[query_id]
        state = self._operators[op_id]
        remaining = tuple(q for q in state.queries if q != query_id)
        if not remaining:
            self._lattice.remove(op_id)
            del self._operators[op_id]
            del self._cpu[op_id]
            return Decision("remove", op_id, None, state.definition, None, {}, 0,
                            (time.perf_counter() - started) * 1000.0, f"{query_id} was its last query",
                            query=query_id)
        current = state.definition
        narrower = fold([self._registrations[q] for q in remaining], current.region)
        keep, narrow = self.costs.keep(current, now), self.costs.narrow(current, narrower, now)
        if narrower == current or (narrow.total, narrow.cpu_delta) >= (keep.total, keep.cpu_delta):
            self._operators[op_id] = OperatorState(current, state.version, remaining)
            return None
        self._set(op_id, OperatorState(narrower, state.version + 1, remaining))
        return Decision("narrow", op_id, narrower, current, None, {"keep": keep.total, "narrow": narrow.total}, 0,
                        (time.perf_counter() - started) * 1000.0,
                        f"without {query_id} a narrower version costs {narrow.total:.6g} against {keep.total:.6g}",
                        breakdown={"keep": keep.to_json(), "narrow": narrow.to_json()}, query=query_id)
