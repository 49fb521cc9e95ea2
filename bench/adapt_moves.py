"""Parts 1 and 2 of the `adapt` benchmark (bench/adapt.py): what moving a partition group
costs (the coordinator's pause, the production delay before, during and after), and failover
after a SIGKILLed worker (until the lost groups are held, and produce, again)."""

from __future__ import annotations

import signal
import time

import numpy as np

from streamjoin.bench import ours, report
from streamjoin.bench.adapt_fleet import (FAILOVER_GOAL_S, FAILOVER_TIMEOUTS, MOVE_TIMEOUT_S, PAUSE_GOAL_BYTES,
                                          PAUSE_GOAL_S, THRESHOLD_S, Plan, Size, base_job, constant, finish, held,
                                          log_events)
from streamjoin.bench.env import BenchEnv
from streamjoin.bench.paced import PacedInput
from streamjoin.launcher import Fleet
from streamjoin.schemas import control
from streamjoin.services.coordinator.status import heartbeats_since, latest_heartbeats
from streamjoin.settings import JobSettings


# ---------------------------------------------------------------- part 1: migration cost


def migration_cost(env: BenchEnv, plan: Plan) -> dict:
    """Part 1 at every state size; the goal is judged at the size whose groups are nearest 5 MB."""
    runs = [migration_run(env, plan, size, i) for i, size in enumerate(plan.sizes)]
    nearest = min(runs, key=lambda r: abs(r["state_bytes_median"] - PAUSE_GOAL_BYTES))
    p99 = nearest["pause_s"]["p99"]
    return {"sizes": runs, "goal": {
        "what": f"p99 migration pause of a ~{PAUSE_GOAL_BYTES / 1e6:.0f} MB group under {PAUSE_GOAL_S * 1000:.0f} ms",
        "judged_at_state_bytes": nearest["state_bytes_median"], "pause_p99_s": p99, "met": p99 < PAUSE_GOAL_S}}


def migration_run(env: BenchEnv, plan: Plan, size: Size, index: int) -> dict:
    """One state size: the window fills, then `plan.moves` moves, `settle_s` apart, alternating groups."""
    window_s = size.window_ms / 1000
    span = window_s + plan.settle_s + plan.moves * (plan.settle_s + 2)
    job = base_job(env, f"adapt-move{index}", 2, plan.partitions, [ours.Step(size.rate, span)], size.window_ms)
    fleet, ids = ours.start_fleet(env, job, 2)
    feed = PacedInput(job, env.bootstrap, constant(size.rate), seed=job.workload.random_state)
    feed.start()
    env.console.print(f"[bold cyan]bench[/] {size.rate:.0f} tuples/s per stream, {window_s:.0f}s window: "
                      f"filling it, then {plan.moves} moves")
    time.sleep(window_s + plan.settle_s)
    owners = {g: w for w, groups in held(job, env).items() for g in groups}
    moves = []
    for m in range(plan.moves):
        group = m % plan.partitions
        target = next(w for w in ids if w != owners[group])
        moves.append(move(env, job, fleet, group, target))
        owners[group] = target
        time.sleep(plan.settle_s)
    done = finish(env, job, fleet, feed, plan.verifier)
    beats = sorted(heartbeats_since(job, env.cluster, time.time() - moves[0]["started_ms"] / 1000 + 30),
                   key=lambda b: b.wall_ms)
    return summarise_moves(job, size, [m | pause_stages(m, beats) for m in moves], done, plan.settle_s)


def move(env: BenchEnv, job: JobSettings, fleet: Fleet, group: int, target: str) -> dict:
    """Move `group` to `target` as `streamjoin move` does (a MoveGroup request on the control
    topic) and wait for the coordinator's `move done`; the move's start, pause, where the pause
    went, and the group's state bytes (its sender's last heartbeat before the move)."""
    seen = len(log_events(fleet, "move done"))
    state_bytes = next(b.group_bytes.get(group, 0) for b in latest_heartbeats(job, env.cluster, window_s=5).values()
                       if group in b.groups)
    producer = env.cluster.producer()
    started_ms = int(time.time() * 1000)
    producer.produce(job.control_topic, value=control.encode(control.MoveGroup(group=group, to=target)),
                     key=b"request", partition=0)
    producer.flush(30)
    deadline = time.monotonic() + MOVE_TIMEOUT_S
    while not log_events(fleet, "move done")[seen:]:
        fleet.assert_running()
        if time.monotonic() > deadline:
            raise TimeoutError(f"moving group {group} to {target} did not finish in {MOVE_TIMEOUT_S:.0f}s: "
                               f"{fleet.complaints()}")
        time.sleep(0.1)
    done = log_events(fleet, "move done")[seen]
    return {"group": group, "from": done["sender"], "to": target, "started_ms": started_ms,
            "pause_s": done["pause_s"], "state_bytes": state_bytes, "coordinator_state_bytes": done["state_bytes"]}


def pause_stages(m: dict, beats: list[control.Heartbeat]) -> dict:
    """Where move `m`'s time went, from the workers' heartbeats (a worker sends one as soon as it
    applies an assignment): `sender_s` from our request (so it includes the request reaching the
    coordinator, before the coordinator's pause starts) to the sender's first heartbeat without
    the group (its last cycle committed), `receiver_s` from then to the receiver's first heartbeat
    holding it (fenced, restored from the changelog, fetching from the barrier)."""
    after = [b for b in beats if b.wall_ms >= m["started_ms"]]
    released = next((b.wall_ms for b in after if b.worker == m["from"] and m["group"] not in b.groups), None)
    taken = next((b.wall_ms for b in after if b.worker == m["to"] and m["group"] in b.groups), None)
    if released is None or taken is None:
        return {"sender_s": None, "receiver_s": None}
    return {"sender_s": (released - m["started_ms"]) / 1000, "receiver_s": (taken - released) / 1000}


def summarise_moves(job: JobSettings, size: Size, moves: list[dict], done: dict, settle_s: float) -> dict:
    """Pauses and bytes of one size's moves, and the delays before, during and after them (all
    groups, and the moved group alone), each result placed by the arrival of its newest input."""
    timing = done.pop("timing")
    pauses = np.array([m["pause_s"] for m in moves])
    state = np.array([m["state_bytes"] for m in moves])
    phases: dict[str, dict[str, list[np.ndarray]]] = {p: {"all": [], "moved": []}
                                                      for p in ("before", "during", "after")}
    settle_ms = settle_s * 1000
    for m in moves:
        start, end = m["started_ms"], m["started_ms"] + m["pause_s"] * 1000
        spans = {"before": (start - settle_ms, start), "during": (start, end), "after": (end, end + settle_ms)}
        for phase, (lo, hi) in spans.items():
            inside = (timing["newest_ms"] >= lo) & (timing["newest_ms"] < hi)
            phases[phase]["all"].append(timing["delay_ms"][inside])
            phases[phase]["moved"].append(timing["delay_ms"][inside & (timing["group"] == m["group"])])
    delay = {phase: {which: report.delay_stats(np.concatenate(parts), THRESHOLD_S * 1000)
                     for which, parts in by.items()} for phase, by in phases.items()}
    return {"job": job.job, "rate_per_stream": size.rate, "window_ms": size.window_ms,
            "state_bytes_median": float(np.median(state)),
            "pause_s": {"p50": float(np.percentile(pauses, 50)), "p99": float(np.percentile(pauses, 99)),
                        "max": float(pauses.max())},
            "pause_per_mb_s": float(np.median(pauses / np.maximum(state / 1e6, 1e-9))),
            "moves": moves, "delay": delay, **done}


# ---------------------------------------------------------------- part 2: failover


def failover(env: BenchEnv, plan: Plan) -> dict:
    """SIGKILL workers one at a time (never restarted) until one is left; per kill, how long
    until the lost groups are held and produce again."""
    job = base_job(env, "adapt-failover", plan.failover_workers, plan.partitions,
                   [ours.Step(plan.failover_rate, 60)], plan.window_ms, FAILOVER_TIMEOUTS)
    fleet, ids = ours.start_fleet(env, job, plan.failover_workers)
    fleet.restart_workers = False
    began_ms = int(time.time() * 1000)
    feed = PacedInput(job, env.bootstrap, constant(plan.failover_rate), seed=job.workload.random_state)
    feed.start()
    time.sleep(plan.settle_s * 2)
    alive, kills = list(ids), []
    while len(alive) > 1:
        victim = alive.pop()
        lost = held(job, env)[victim]
        killed_ms = int(time.time() * 1000)
        fleet.kill(victim, signal.SIGKILL)
        wait_taken(job, env, fleet, set(lost), alive)
        kills.append({"worker": victim, "groups": lost, "killed_ms": killed_ms, "survivors": list(alive)})
        time.sleep(plan.settle_s)
    done = finish(env, job, fleet, feed, plan.verifier)
    beats = heartbeats_since(job, env.cluster, (time.time() * 1000 - began_ms) / 1000 + 30)
    timing = done.pop("timing")
    measured = [failover_times(kill, beats, timing) for kill in kills]
    worst = max(k["producing_again_s"] for k in measured)
    return {"job": job.job, "workers": plan.failover_workers, "rate_per_stream": plan.failover_rate,
            **FAILOVER_TIMEOUTS, "kills": measured,
            "producing_again_s_median": float(np.median([k["producing_again_s"] for k in measured])),
            "goal": {"what": f"lost groups produce again within {FAILOVER_GOAL_S:.0f} s of the SIGKILL",
                     "worst_s": worst, "met": worst < FAILOVER_GOAL_S}, **done}


def wait_taken(job: JobSettings, env: BenchEnv, fleet: Fleet, lost: set[int], alive: list[str]) -> None:
    """Until workers of `alive` hold every group of `lost`."""
    deadline = time.monotonic() + 120
    while not lost <= {g for w, groups in held(job, env).items() if w in alive for g in groups}:
        fleet.assert_running()
        if time.monotonic() > deadline:
            raise TimeoutError(f"groups {sorted(lost)} were not failed over within 120 s: {fleet.complaints()}")
        time.sleep(0.5)


def failover_times(kill: dict, beats: list[control.Heartbeat], timing: dict) -> dict:
    """Per lost group: seconds from the kill to the first heartbeat of a survivor holding it, and
    to its first result produced after the kill; the kill's figure is the slowest group's."""
    killed = kill["killed_ms"]
    per_group = {}
    for g in kill["groups"]:
        holding = [b.wall_ms for b in beats if b.worker in kill["survivors"] and b.wall_ms > killed and g in b.groups]
        produced = timing["produced_ms"][(timing["group"] == g) & (timing["produced_ms"] > killed)]
        per_group[str(g)] = {"held_s": (min(holding) - killed) / 1000 if holding else None,
                             "first_result_s": (int(produced.min()) - killed) / 1000 if len(produced) else None}
    firsts = [v["first_result_s"] for v in per_group.values()]
    holds = [v["held_s"] for v in per_group.values()]
    return {**kill, "per_group": per_group,
            "held_s": max(h if h is not None else float("inf") for h in holds),
            "producing_again_s": max(f if f is not None else float("inf") for f in firsts)}
