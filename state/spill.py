"""Which groups to push to disk: the throughput-oriented victim choice of the spill
paper (section 4.3), and the policies it is compared with.

Per group the worker keeps the time of its last insert (T_u) and the results
it produced (P_o); its size (P_s) is its window's bytes in memory.

- productivity (the paper's): groups inactive longer than theta_t
  (`spill.inactive_ms`) first, longest idle first; then the largest P_s / P_o
  (a group that produced nothing is infinitely unproductive), so the groups
  left in memory are the ones likely to produce the most results;
- most-productive: the smallest P_s / P_o first, the other end of the
  spectrum (the paper's Figure 11, "30%-High-OutputRate");
- lru: least recently used first, blind to productivity.

Groups are taken in that order until the bytes pushed reach the target. A
group with no statistics yet (it just arrived, by a move or a restart) is
pushed last, largest first: it has not had the chance to show its
productivity, and a move chose it for being productive.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from streamjoin.settings import SpillSpec


@dataclass
class GroupActivity:
    """The spill paper's statistics of one group: `last_insert_ms` (T_u, wall clock of the last batch
    that inserted tuples) and `results` (P_o, results produced since the worker took it)."""

    last_insert_ms: int = 0
    results: int = 0


def unproductivity(size_bytes: int, results: int) -> float:
    """P_s / P_o: bytes held per result produced; infinite when nothing was produced."""
    return size_bytes / results if results else math.inf


def choose_victims(sizes: Mapping[int, int], activity: Mapping[int, GroupActivity], recency: Mapping[int, int],
                   target: float, spill: SpillSpec, now_ms: int) -> list[int]:
    """The groups to push, in push order, whose bytes first reach `target`.

    sizes: in-memory window bytes of each candidate group; activity: its statistics (absent:
    none yet);
    recency: its rank by last use (0 = least recently used); spill: the policy and theta_t;
    now_ms: the wall clock inactivity is measured against."""
    known = sorted((g for g in sizes if g in activity),
                   key=lambda g: _rank(g, sizes[g], activity[g], recency[g], spill, now_ms))
    order = known + sorted((g for g in sizes if g not in activity), key=lambda g: (-sizes[g], g))
    chosen, pushed = [], 0
    for group in order:
        if pushed >= target:
            break
        chosen.append(group)
        pushed += sizes[group]
    return chosen


def _rank(group: int, size: int, activity: GroupActivity, recency: int, spill: SpillSpec,
          now_ms: int) -> tuple[float, ...]:
    """The sort key of `group` under `spill.victims`: smaller is pushed first; the group id
    breaks ties so the choice is deterministic."""
    if spill.victims == "lru":
        return (recency, group)
    ratio = unproductivity(size, activity.results)
    if spill.victims == "most-productive":
        return (ratio, -size, group)
    idle = now_ms - activity.last_insert_ms
    if idle > spill.inactive_ms:
        return (0, -idle, group)  # inactive: first, the longest idle first
    return (1, -ratio, -size, group)
