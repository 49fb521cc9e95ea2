"""The reuse lattice against a brute-force scan: the same operator ids for every query,
region mask and search kind, through additions and removals."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.schemas.query import Column, Query, Registration, Selection, SourceWindow
from streamjoin.topology.reuse.lattice import ALL_REGIONS, ReuseLattice
from streamjoin.topology.reuse.operator import OperatorDef, answers, base_match, fold
from tests.profiles import examples

REGIONS = ["r0", "r1", "r2", "r3"]
DOMAINS = {"k": [0, 1], "j": [0, 1], "x": [0, 1, 2], "y": ["p", "q"]}
# Base shapes: (sources, join classes as lists of columns); two share sources but not joins.
SHAPES = [
    (["a", "b"], [["a.k", "b.k"]]),
    (["a", "b"], [["a.j", "b.k"]]),
    (["a", "b"], [["a.k", "b.k"], ["a.j", "b.j"]]),
    (["a", "b", "c"], [["a.k", "b.k", "c.k"]]),
]


def brute_force(ops: dict[str, tuple[OperatorDef, int]], query_or_reg: Query | Registration,
                regions: int | None, relax: bool) -> list[str]:
    """The lattice's search by a scan of every operator (id -> (definition, region bit)):
    the statement `ReuseLattice.search` is tested against."""
    mask = ALL_REGIONS if regions is None else regions
    matches = base_match if relax else answers
    return sorted(op_id for op_id, (op, bit) in ops.items() if bit & mask and matches(op, query_or_reg))



def _column(name: str) -> Column:
    stream, field = name.split(".")
    return Column(stream, field)


def _joins(classes: list[list[str]]) -> tuple[tuple[Column, Column], ...]:
    pairs = [tuple(sorted((_column(a), _column(b)))) for members in classes for a, b in zip(members, members[1:])]
    return tuple(sorted(pairs))  # type: ignore[arg-type]


def _registration(rng: random.Random, number: int, shape: int | None = None) -> Registration:
    """A random query from a small space, so that operators often answer queries unchanged."""
    streams, classes = SHAPES[rng.randrange(len(SHAPES)) if shape is None else shape]
    columns = [Column(s, f) for s in streams for f in ("x", "y")]
    selections = tuple(Selection(c, frozenset(rng.sample(DOMAINS[c.field], rng.randint(1, len(DOMAINS[c.field])))))
                       for c in columns if rng.random() < 0.4)
    windows = tuple(SourceWindow(s, rng.choice([5, 10, 20]), rng.choice([None, 5, 10])) for s in streams)
    query = Query(columns=tuple(rng.sample(columns, rng.randint(1, 2))), windows=windows, joins=_joins(classes),
                  selections=selections)
    return Registration(id=f"q{number}", text="", query=query, sink="out", region=rng.choice(REGIONS),
                        lifetime_ms=rng.choice([None, 100, 1000]), registered_ms=rng.choice([0, 500]), start_ms=0)


def _operators(rng: random.Random, count: int, shape: int | None = None) -> dict[str, tuple[OperatorDef, int]]:
    """`count` operators, each the fold of one to three random queries of one shape."""
    ops = {}
    for n in range(count):
        first = _registration(rng, 0, shape)
        same = SHAPES.index(next(s for s in SHAPES if sorted(s[0]) == sorted(first.query.sources)
                                 and _joins(s[1]) == first.query.joins))
        regs = [first] + [_registration(rng, i, same) for i in range(rng.randint(0, 2))]
        region = rng.randrange(len(REGIONS))
        ops[f"op-{n}"] = (fold(regs, REGIONS[region]), 1 << region)
    return ops


def _lattice(ops: dict[str, tuple[OperatorDef, int]]) -> ReuseLattice:
    lattice = ReuseLattice()
    for op_id, (op, bit) in ops.items():
        lattice.add(op_id, op, bit)
    return lattice


def _agree(lattice: ReuseLattice, ops: dict[str, tuple[OperatorDef, int]], probe: Query | Registration,
           mask: int | None) -> tuple[int, int]:
    """Assert search == brute force both ways; return how many each kind found."""
    found = []
    for relax in (True, False):
        got = lattice.search(probe, mask, relax)
        assert got == brute_force(ops, probe, mask, relax), (probe, mask, relax)
        found.append(len(got))
    return found[0], found[1]


@settings(max_examples=examples(200), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), count=st.integers(0, 40), removed=st.integers(0, 40))
def test_search_equals_brute_force_through_adds_and_removes(seed: int, count: int, removed: int) -> None:
    rng = random.Random(seed)
    ops = _operators(rng, count)
    lattice = _lattice(ops)
    for op_id in rng.sample(sorted(ops), min(removed, count)):
        lattice.remove(op_id)
        del ops[op_id]
    assert len(lattice) == len(ops)
    for n in range(10):
        reg = _registration(rng, n)
        mask = rng.choice([None, 0, 1, 2, 5, 6, 15, rng.randrange(16)])
        _agree(lattice, ops, reg, mask)
        _agree(lattice, ops, reg.query, mask)  # a bare query: no lifetime to check


def test_searches_find_operators_and_tell_relaxable_from_answering() -> None:
    # guards the property test from passing on empty answers: a fixed mix where both kinds hit
    rng = random.Random(13)
    ops = _operators(rng, 300)
    lattice = _lattice(ops)
    totals = [0, 0]
    for n in range(300):
        reg = _registration(rng, n)
        for kind, hits in enumerate(_agree(lattice, ops, reg, rng.choice([None, 3, 12]))):
            totals[kind] += hits
    assert totals[0] > totals[1] > 0


def test_regions_prune_by_operator_location_and_removal_empties_the_tree() -> None:
    rng = random.Random(5)
    reg = _registration(rng, 0, shape=0)
    op = fold([reg], "r1")
    lattice = ReuseLattice()
    lattice.add("here", op, 0b0010)
    lattice.add("there", op, 0b1000)
    assert lattice.search(reg, None, relax=False) == ["here", "there"]
    assert lattice.search(reg, 0b0010, relax=False) == ["here"]
    assert lattice.search(reg, 0b0101, relax=True) == []
    with pytest.raises(ValueError, match="already"):
        lattice.add("here", op, 0b0010)
    with pytest.raises(ValueError, match="positive"):
        lattice.add("nowhere", op, 0)
    lattice.remove("here")
    lattice.remove("there")
    with pytest.raises(KeyError):
        lattice.remove("there")
    assert lattice.search(reg) == [] and not lattice._root.children and not lattice._root.bit_counts


def _direct_operators(rng: random.Random, count: int) -> dict[str, tuple[OperatorDef, int]]:
    """`count` operators of shape 2 built field by field (folding 10,000 would take seconds)."""
    streams, classes = SHAPES[2]
    filtered = [Column(s, f) for s in streams for f in ("x", "y")]
    keys = {_column(c) for members in classes for c in members}
    ops = {}
    for n in range(count):
        cover = tuple(Selection(c, frozenset(rng.sample(DOMAINS[c.field], rng.randint(1, len(DOMAINS[c.field])))))
                      for c in filtered if rng.random() < 0.4)
        columns = tuple(sorted(keys | set(rng.sample(filtered, rng.randint(0, len(filtered))))))
        region = rng.randrange(len(REGIONS))
        op = OperatorDef(sources=tuple(streams), join_classes=frozenset(frozenset(map(_column, m)) for m in classes),
                         selections=cover, columns=columns,
                         range_ms=tuple((s, rng.choice([5, 10, 20])) for s in streams),
                         slide_ms=rng.choice([None, 5]), expires_ms=rng.choice([None, 600, 1500]),
                         region=REGIONS[region])
        ops[f"op-{n}"] = (op, 1 << region)
    return ops


def test_search_among_ten_thousand_operators_is_fast() -> None:
    # All on one base (the worst case: the base lookups prune nothing), four regions.
    rng = random.Random(11)
    ops = _direct_operators(rng, 10_000)
    lattice = _lattice(ops)
    probes = [_registration(rng, n, shape=2) for n in range(20)]
    started = time.perf_counter()
    answering = 0
    for reg in probes:
        lattice.search(reg, 0b0001, relax=True)
        answering += len(lattice.search(reg, None, relax=False))
    per_search = (time.perf_counter() - started) / (2 * len(probes))
    assert answering > 0  # the exact searches descended to leaves
    for reg in probes[:2]:
        _agree(lattice, ops, reg, None)
    # a brute-force scan of 10,000 operators takes far longer; this bound allows a slow, shared machine
    assert per_search < 0.05, f"{per_search * 1000:.1f} ms per search"
