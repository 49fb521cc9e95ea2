"""Continuous queries over the airline catalog (streamjoin/jobs/airline.yaml), drawn from
templates: the query mix of the operator-sharing paper's Delta OIS workload (section 2.1), for the reuse
benchmark and the tests.

Four templates, each a windowed equi-join on one join class:

  checkins   FLIGHTS x CHECKINS on flights.num = checkins.flight (gate agents' boards)
  baggage    FLIGHTS x BAGGAGE on flights.num = baggage.flight (baggage displays)
  turnaround FLIGHTS x CHECKINS x BAGGAGE on num = flight = flight (operations)
  weather    WEATHER x FLIGHTS on weather.city = flights.dest (dispatch)

A query draws its selections (flights.carrier IN 1-3 carriers, the big ones likelier, as
the workload's Zipf shares; sometimes flights.terminal = one terminal), a RANGE of 1, 5
or 10 minutes per source, one SLIDE of 1 or 5 minutes no longer than its shortest RANGE
(or none), a projection of 1-3 fields per source (the flight number always), a sink topic
in one of the regions and a lifetime (some run until dropped). Everything is drawn from
one generator seeded by `seed`, so the same arguments give the same queries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamjoin.services.workloads import AIRLINE_FIELDS, CARRIER_CODES, carrier_shares

MINUTE = "MIN"  # the unit keyword as the operator-sharing paper writes it: [RANGE 5 MIN]
RANGES_MIN = (1, 5, 10)
SLIDES_MIN = (1, 5)
LIFETIMES_S: tuple[float | None, ...] = (None, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
_LIFETIME_SHARES = (0.3, 0.2, 0.25, 0.15, 0.1)
_CARRIER_SELECTION = 0.8  # share of queries naming carriers
_TERMINAL_SELECTION = 0.3  # share of queries naming one terminal
_NO_SLIDE = 0.2  # share of queries released as soon as found


@dataclass(frozen=True)
class Template:
    """A join shape: its sources in FROM order, its join predicates (`stream.field` pairs) and
    its share of the queries."""

    name: str
    sources: tuple[str, ...]
    joins: tuple[tuple[str, str], ...]
    share: float


TEMPLATES = (
    Template("checkins", ("flights", "checkins"), (("flights.num", "checkins.flight"),), 0.35),
    Template("baggage", ("flights", "baggage"), (("flights.num", "baggage.flight"),), 0.25),
    Template("turnaround", ("flights", "checkins", "baggage"),
             (("flights.num", "checkins.flight"), ("flights.num", "baggage.flight")), 0.2),
    Template("weather", ("weather", "flights"), (("weather.city", "flights.dest"),), 0.2),
)
# RANGE shares over RANGES_MIN per source: flight status updates are rare, so their windows run longer.
_RANGE_SHARES = {"flights": (0.1, 0.5, 0.4)}  # others: _DEFAULT_RANGE_SHARES
_DEFAULT_RANGE_SHARES = (0.3, 0.4, 0.3)
# Regions nearer the head of the list (the operations centre first) hold more sinks.
_REGION_DECAY = 0.75

GeneratedQuery = tuple[str, str, str, float | None]


def generate_queries(n: int, seed: int, regions: list[str], *, carriers: int = 12, carrier_skew: float = 1.0,
                     terminals: int = 5) -> list[GeneratedQuery]:
    """`n` queries as (CQL text, sink topic, region, lifetime in seconds or None = until dropped).

    n: how many (>= 0); seed: the generator's seed; regions: the regions sinks are spread over
    (non-empty); carriers, carrier_skew, terminals: the workload's, so selections name the
    carriers and terminals the data holds, the big carriers likelier. The first k of n queries
    are the k queries of the same seed. Raises ValueError on an empty region list, a negative
    n or a carrier/terminal count out of the workload's bounds."""
    if n < 0:
        raise ValueError(f"n is a number of queries, got {n}")
    if not regions:
        raise ValueError("regions: give at least one region to place sinks in")
    if not 1 <= carriers <= len(CARRIER_CODES) or not 1 <= terminals <= 26:
        raise ValueError(f"carriers must lie in 1..{len(CARRIER_CODES)} and terminals in 1..26, "
                         f"got {carriers} and {terminals}")
    rng = np.random.default_rng(seed)
    template_shares = np.array([t.share for t in TEMPLATES])
    region_weights = _REGION_DECAY ** np.arange(len(regions))
    out = []
    for i in range(n):
        template = TEMPLATES[rng.choice(len(TEMPLATES), p=template_shares / template_shares.sum())]
        region = regions[rng.choice(len(regions), p=region_weights / region_weights.sum())]
        text = query_text(rng, template, carrier_shares(carriers, carrier_skew), terminals)
        lifetime = LIFETIMES_S[rng.choice(len(LIFETIMES_S), p=_LIFETIME_SHARES)]
        out.append((text, f"ois.{region}.{template.name}.q{i:05d}", region, lifetime))
    return out


def query_text(rng: np.random.Generator, template: Template, shares: np.ndarray, terminals: int) -> str:
    """One query of `template` in CQL, its windows, projection and selections drawn from `rng`;
    `shares`: the carriers' shares of flights, in CARRIER_CODES order."""
    ranges = {s: RANGES_MIN[rng.choice(len(RANGES_MIN), p=_RANGE_SHARES.get(s, _DEFAULT_RANGE_SHARES))]
              for s in template.sources}
    slide = _slide(rng, min(ranges.values()))
    windows = ", ".join(f"{s} [{_window(ranges[s], slide)}]" for s in template.sources)
    where = [f"{left} = {right}" for left, right in template.joins] + _selections(rng, shares, terminals)
    return f"SELECT {', '.join(_projection(rng, template))} FROM {windows} WHERE {' AND '.join(where)}"


def _slide(rng: np.random.Generator, shortest_range: int) -> int | None:
    """A SLIDE (minutes) no longer than the shortest RANGE, or None (release at once)."""
    if rng.random() < _NO_SLIDE:
        return None
    fitting = [s for s in SLIDES_MIN if s <= shortest_range]
    return fitting[rng.integers(len(fitting))]


def _window(range_min: int, slide_min: int | None) -> str:
    text = f"RANGE {range_min} {MINUTE}"
    return text if slide_min is None else f"{text} SLIDE {slide_min} {MINUTE}"


def _projection(rng: np.random.Generator, template: Template) -> list[str]:
    """flights.num, then 1-3 other fields of each source (distinct, in the stream's field order)."""
    columns = ["flights.num"]
    for stream in template.sources:
        others = [f for f in AIRLINE_FIELDS[stream] if f"{stream}.{f}" not in columns]
        picked = rng.choice(len(others), rng.integers(1, min(3, len(others)) + 1), replace=False)
        columns += [f"{stream}.{others[k]}" for k in sorted(picked)]
    return columns


def _selections(rng: np.random.Generator, shares: np.ndarray, terminals: int) -> list[str]:
    """flights.carrier IN (1-3 carriers, drawn by their shares of flights) and/or flights.terminal = one."""
    out = []
    if rng.random() < _CARRIER_SELECTION:
        picked = rng.choice(len(shares), min(len(shares), int(rng.integers(1, 4))), replace=False, p=shares)
        out.append(f"flights.carrier IN ({', '.join(repr(CARRIER_CODES[c]) for c in sorted(picked))})")
    if rng.random() < _TERMINAL_SELECTION:
        out.append(f"flights.terminal = '{chr(ord('A') + int(rng.integers(terminals)))}'")
    return out
