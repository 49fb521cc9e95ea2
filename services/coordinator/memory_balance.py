"""Memory balancing and the disk adaptations, after the spill paper (sections 5.1,
5.2 and 6). When M_least / M_most < `memory_balance_theta`, about (M_most - M_least) / 2 of
window state moves from the fullest to the emptiest worker, at most once per
`memory_balance_interval_ms`. `disk_adaptation` says how balancing lives with the workers'
spill. local: each worker spills on its own and the policy ignores spill (memory = all window
state). lazy-disk: memory = window bytes in memory; no policy move takes a group with
generations on disk (restriction 2), balancing does not start in an epoch in which its sender
or receiver pushed (restriction 1), and it moves the sender's productive groups (smallest
P_s / P_o) first, so what spill later pushes on either side is the less productive state.
active-disk: lazy-disk, and once memory needs no move, a worker whose output rate per group
lags (Max_rate / Min_rate > `output_rate_theta`) is told to push its least productive groups,
at most M_q - M_c bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from streamjoin.services.coordinator.epoch import (
    DISK_RULE, MEMORY_RULE, History, Move, Plan, PushOrder, WorkerObservation, cooldown_left, memory_signal, movable,
    noted, pinned,
)
from streamjoin.settings import CoordinatorSpec
from streamjoin.state.spill import unproductivity


def plan_memory(plan: Plan, active: list[WorkerObservation], settings: CoordinatorSpec,
                history: History) -> tuple[Plan, bool]:
    """Section 5.1: when M_least / M_most < theta_d, move (M_most - M_least) / 2 of state from
    the fullest worker (the sender) to the emptiest (the receiver); 5.2: at most once per
    `memory_balance_interval_ms`. Under lazy-disk and active-disk (section 6) M is the window
    bytes in memory, the sender's groups with generations on disk stay (restriction 2), and no
    balancing starts in an epoch in which the sender or the receiver pushed (restriction 1).

    Returns the plan and whether memory is settled: balanced, or unbalanced in a way no move
    can narrow. It is not settled while balancing moves or only waits (its interval, a push):
    active-disk then orders no push, since balancing will act soon (one adaptation at a time)."""
    if len(active) < 2:
        return plan, True
    ordered = sorted(active, key=lambda o: (memory_signal(o, settings), o.worker))
    receiver, sender = ordered[0], ordered[-1]
    most, least = memory_signal(sender, settings), memory_signal(receiver, settings)
    if most == 0 or least / most >= settings.memory_balance_theta:
        return plan, True
    ratio = f"M_least / M_most = {least}/{most} = {least / most:.3f} < {settings.memory_balance_theta}"
    if settings.disk_adaptation != "local":
        ratio = f"{ratio} (window bytes in memory, {settings.disk_adaptation})"
    left = cooldown_left(history.last_memory_ms, plan.now_ms, settings.memory_balance_interval_ms)
    if left:
        return noted(plan, f"{ratio}: memory balancing waits {left / 1000:.1f} s more for "
                           "coordinator.memory_balance_interval_ms (spill paper, section 5.2)"), False
    pushers = [o.worker for o in (sender, receiver) if o.pushed]
    if pushers and settings.disk_adaptation != "local":
        return noted(plan, f"{ratio}, but {' and '.join(pushers)} pushed state to disk in this epoch: memory "
                           f"balancing waits for an epoch without a push ({DISK_RULE}, restriction 1: one "
                           "adaptation at a time)"), False
    kept = pinned(sender, settings)
    staying = (f" ({len(kept)} of its groups have generations on disk and stay: {DISK_RULE}, restriction 2)"
               if kept else "")
    candidates, target = movable(sender, settings), (most - least) / 2
    by_productivity = settings.disk_adaptation != "local"  # section 6 moves the productive groups
    chosen = half_the_gap(candidates, target,
                          productive_first(candidates, sender.group_results) if by_productivity else None)
    if not chosen:
        return noted(plan, f"{ratio}, but every group of {sender.worker} that may move{staying} is at least the "
                           "gap it would close: moving one would not narrow it"), True
    picked = ", its productive groups first (smallest P_s / P_o)" if by_productivity else ""
    why = (f"{ratio}: move about (M_most - M_least) / 2 = {target:.0f} bytes from {sender.worker} "
           f"(fullest) to {receiver.worker} (emptiest){picked}{staying} ({MEMORY_RULE})")
    moves = tuple(Move(g, sender.worker, receiver.worker, "memory", sender.group_bytes[g], why) for g in chosen)
    return replace(plan, moves=moves), False


def half_the_gap(group_bytes: Mapping[int, int], target: float, order: Sequence[int] | None = None) -> list[int]:
    """Groups whose bytes add up close to `target` (memory balancing's half gap), at group granularity:
    in `order` (default: largest first), each taken when it brings the total closer to the
    target (its size is below twice what is left). The total never exceeds twice the target,
    so the gap always narrows; a group left out is at least twice what remains."""
    if order is None:
        order = sorted(group_bytes, key=lambda g: (-group_bytes[g], g))
    chosen, remaining = [], target
    for group in order:
        size = group_bytes[group]
        if 0 < size < 2 * remaining:
            chosen.append(group)
            remaining -= size
    return chosen


def productive_first(group_bytes: Mapping[int, int], group_results: Mapping[int, int]) -> list[int]:
    """The groups of `group_bytes` in section 6's move order for lazy-disk and active-disk: the
    productive first (smallest P_s / P_o, bytes per result; the larger group first among equals),
    then the groups that produced nothing or have no statistics, largest first."""
    return sorted(group_bytes, key=lambda g: (unproductivity(group_bytes[g], group_results.get(g, 0)),
                                              -group_bytes[g], g))


# ------------------------------------------------------------------ active-disk
def output_rates(active: list[WorkerObservation], epoch_ms: int) -> dict[str, float]:
    """Section 6: a worker's average output rate, the results it produced in the epoch (the
    sampling time) per second, divided by the number of partition groups it holds. Only workers
    with a results count and at least one group have one."""
    return {o.worker: o.results / (epoch_ms / 1000) / len(o.group_bytes)
            for o in active if o.results is not None and o.group_bytes}


def plan_push(plan: Plan, active: list[WorkerObservation], settings: CoordinatorSpec, history: History,
              push_fraction: float) -> Plan:
    """Section 6, active-disk, in an epoch whose memory is settled and that moves nothing: when
    Max_rate / Min_rate > theta_f (a Min_rate of 0 below a Max_rate above 0 counts as diverged;
    all 0 is no signal), the worker with the lowest rate pushes min(push_fraction x its memory,
    M_q - M_c) bytes, where M_q = in-memory plus spilled bytes of the workers reporting spill
    (the query's memory need) and M_c = their budgets; none when M_q <= M_c (the cluster's
    memory holds the query). At most one order per `memory_balance_interval_ms`, so a push
    shows in the next epochs' rates before another is ordered."""
    # Only workers reporting spill take part: the others neither count in M_q and M_c nor obey a push.
    reporting = [o for o in active if o.memory_bytes is not None]
    rates = output_rates(reporting, settings.reorg_epoch_ms)
    if len(rates) < 2 or max(rates.values()) == 0:
        return plan
    fastest, slowest = max(rates.values()), min(rates.values())
    if slowest > 0 and fastest / slowest <= settings.output_rate_theta:
        return plan
    spread = (f"Max_rate / Min_rate = {fastest:.3g} / {slowest:.3g} results/s per group "
              f"{'= ' + format(fastest / slowest, '.3g') if slowest else '(Min_rate 0)'} > theta_f "
              f"{settings.output_rate_theta}")
    need = sum(o.memory + o.spilled_bytes for o in reporting)
    budget = sum(o.memory_budget for o in reporting)
    if need <= budget:
        return noted(plan, f"{spread}, but M_q = {need} <= M_c = {budget} bytes: the cluster's memory holds the "
                           f"query, nothing is pushed ({DISK_RULE}, active-disk)")
    left = cooldown_left(history.last_push_ms, plan.now_ms, settings.memory_balance_interval_ms)
    if left:
        return noted(plan, f"{spread}: the next push order waits {left / 1000:.1f} s more for "
                           f"coordinator.memory_balance_interval_ms ({DISK_RULE}, active-disk)")
    # Among equally slow workers the one holding most in memory frees most for the others.
    lowest = min((o for o in reporting if o.worker in rates),
                 key=lambda o: (rates[o.worker], -o.memory, o.worker))
    amount = int(min(push_fraction * lowest.memory, need - budget))
    if amount <= 0:
        return noted(plan, f"{spread}: {lowest.worker} has the lowest rate but holds nothing in memory to push "
                           f"({DISK_RULE}, active-disk)")
    why = (f"{spread}: {lowest.worker} has the lowest rate ({rates[lowest.worker]:.3g} over "
           f"{len(lowest.group_bytes)} groups) and pushes min(push_fraction {push_fraction} x {lowest.memory}, "
           f"M_q - M_c = {need} - {budget}) = {amount} bytes, least productive groups first, leaving memory to "
           f"the more productive groups ({DISK_RULE}, active-disk)")
    return replace(plan, push=PushOrder(lowest.worker, amount, why))
