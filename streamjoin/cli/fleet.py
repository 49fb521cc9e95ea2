"""Operating a running job through its coordinator: the fleet's status, moving and draining
partition groups (hash mode), the adaptive policy's dry run, and resizing a PSP ring."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from streamjoin.cli.common import BootstrapOpt, JobOpt, JsonOpt, cluster_of, console, job_settings, send_control
from streamjoin.settings import JobSettings

ring_app = typer.Typer(no_args_is_help=True, help="Resize a PSP ring (ring mode jobs).")

WaitOpt = Annotated[float, typer.Option("--wait", help="seconds to wait for it to finish (0: do not wait)")]


def status(job: JobOpt = None, bootstrap: BootstrapOpt = None, as_json: JsonOpt = False) -> None:
    """Workers, their partition groups, lag, window state size and spill (memory against the
    budget, bytes on disk, generations, clean-up backlog), the hot keys, and those split over
    slots (their split factor and the workers of their sub-groups)."""
    from streamjoin.services.coordinator.status import snapshot

    s = job_settings(job, bootstrap=bootstrap)
    snap = snapshot(s, cluster_of(s))
    if as_json:
        print(json.dumps(snap, indent=2))
        return
    table = Table(title=f"job {snap['job']}: {snap['groups_placed']} groups placed, epoch {snap['epoch']}, "
                        f"{len(snap['moving'])} moving")
    for col in ("worker", "alive", "role", "groups", "epoch", "lag", "backlog KB", "state MB", "tuples",
                "memory MB (in/budget)", "spilled MB", "generations", "clean-up MB"):
        table.add_column(col)
    for w in snap["workers"]:
        kb = f"{w['backlog_bytes'] / 1e3:.0f}" if w["backlog_bytes"] is not None else "-"
        memory = f"{_mb(w['memory_bytes'])}/{_mb(w['memory_budget'])}" if w["memory_budget"] else "-"
        table.add_row(w["worker"], "yes" if w["alive"] else "NO", w["role"], str(len(w["held_groups"])),
                      str(w["epoch"]), str(w["lag"]), kb, _mb(w["state_bytes"]), str(w["state_tuples"]),
                      memory, _mb(w["spilled_bytes"]), _or_dash(w["generations"]), _mb(w["cleanup_backlog_bytes"]))
    Console().print(table)
    for m in snap["moving"]:
        Console().print(f"group {m['group']}: moving from {m['from']} to {m['to']}")
    for h in snap["hot_keys"]:
        Console().print(f"hot key {h['key']!r} (group {h['group']}, on {h['worker']}): "
                        f"{h['share']:.0%} of the input")
    for k in snap["split_keys"]:
        Console().print(f"split key {k['key']!r} (group {k['group']}): {k['factor']} sub-groups on "
                        f"{', '.join(str(w) for w in k['workers'])}{' (merging)' if k['merging'] else ''}")
    if snap["ring_failed"]:
        Console().print(f"[red]ring failed ({snap['ring_failed']}): it produces no more results; "
                        "restart the job on fresh topics[/red]")


def _mb(value: int | None) -> str:
    """`value` bytes in MB for a status cell; "-" when the worker did not report it."""
    return f"{value / 1e6:.1f}" if value is not None else "-"


def _or_dash(value: int | None) -> str:
    return str(value) if value is not None else "-"


def _placement_request(s: JobSettings, request: object) -> None:
    """Send an operator's request to the coordinator (hash mode only)."""
    if s.join.mode != "hash":
        console.print(f"[red]error:[/red] job {s.job} has join.mode={s.join.mode!r}; moving groups needs join.mode: hash")
        raise typer.Exit(2)
    send_control(s, request, b"request")


def _wait_for(s: JobSettings, done, what: str, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    """Poll `streamjoin status` until `done(snapshot)`; exit 1 naming `what` after `timeout_s`."""
    import time

    from streamjoin.services.coordinator.status import snapshot

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = snapshot(s, cluster_of(s))
        if done(snap):
            print(json.dumps({"done": what, "epoch": snap["epoch"]}))
            return
        time.sleep(1)
    console.print(f"[red]error:[/red] {what}: not done within {timeout_s:.0f} s (see the coordinator's log: a "
                  "refused request says why)")
    raise typer.Exit(1)


def move(group: Annotated[int, typer.Argument(help="the partition group to move")],
         to: Annotated[str, typer.Option("--to", help="the live worker to move it to")],
         job: JobOpt = None, bootstrap: BootstrapOpt = None, wait: WaitOpt = 120.0) -> None:
    """Move a partition group to another worker, live and exactly (the migration protocol)."""
    from streamjoin.schemas import control

    s = job_settings(job, bootstrap=bootstrap)
    if not 0 <= group < s.partitions:
        console.print(f"[red]error:[/red] GROUP must be in 0..{s.partitions - 1} (the job's partitions)")
        raise typer.Exit(2)
    _placement_request(s, control.MoveGroup(group=group, to=to))
    if wait > 0:
        _wait_for(s, lambda snap: any(w["worker"] == to and group in w["held_groups"] for w in snap["workers"])
                  and not any(m["group"] == group for m in snap["moving"]), f"group {group} on {to}", wait)


def drain(worker_id: Annotated[str, typer.Argument(help="the worker to move every group off")],
          job: JobOpt = None, bootstrap: BootstrapOpt = None, wait: WaitOpt = 300.0) -> None:
    """Move every partition group off a worker (before maintenance); it is given none after."""
    from streamjoin.schemas import control

    s = job_settings(job, bootstrap=bootstrap)
    _placement_request(s, control.DrainWorker(worker=worker_id))
    if wait > 0:
        _wait_for(s, lambda snap: all(not (w["placed_groups"] or w["held_groups"]) for w in snap["workers"]
                                      if w["worker"] == worker_id) and not snap["moving"],
                  f"{worker_id} drained", wait)


def rebalance(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print what the adaptive policy would do now")] = False,
    job: JobOpt = None, bootstrap: BootstrapOpt = None,
    random_state: Annotated[Optional[int],
                            typer.Option(help="random state of the group choice, for a repeatable plan "
                                              "(default: a fresh one)")] = None,
) -> None:
    """What the coordinator's adaptive policy would do now, and why (hash mode): each worker's
    occupancy, role, state bytes and spill, and the planned moves, scale change or active-disk
    push order (adaptive placement across memory and disk), as JSON.

    Only --dry-run exists (exit 2 without it): with `coordinator.placement: adaptive` the
    coordinator starts the policy's moves itself; `streamjoin move` and `drain` move groups by hand."""
    s = job_settings(job, bootstrap=bootstrap)
    if not dry_run:
        console.print("[red]error:[/red] only `streamjoin rebalance --dry-run` exists: with coordinator.placement: "
                      "adaptive the coordinator starts the policy's moves itself, and `streamjoin move GROUP --to "
                      "WORKER` carries out one by hand")
        raise typer.Exit(2)
    if s.join.mode != "hash":
        console.print(f"[red]error:[/red] job {s.job} has join.mode={s.join.mode!r}; rebalancing places the "
                      "partition groups of join.mode: hash")
        raise typer.Exit(2)
    from streamjoin.services.coordinator.rebalance import read_dry_run

    print(json.dumps(read_dry_run(s, cluster_of(s), random.Random(random_state)), indent=2))


def _ring_change(action: str, worker_id: str, job: Path | None, bootstrap: str | None) -> None:
    from streamjoin.schemas import control

    s = job_settings(job, bootstrap=bootstrap)
    if s.join.mode != "ring":
        console.print(f"[red]error:[/red] job {s.job} has join.mode={s.join.mode!r}; ring commands need join.mode: ring")
        raise typer.Exit(2)
    send_control(s, control.RingChange(action=action, worker=worker_id), b"ring-change")  # type: ignore[arg-type]
    console.print(f"asked the coordinator to {action} {worker_id}; `streamjoin status` shows the ring")


@ring_app.command("add")
def ring_add(worker_id: Annotated[str, typer.Argument(help="a running ring worker's id")],
             job: JobOpt = None, bootstrap: BootstrapOpt = None) -> None:
    """Add a running worker to the ring (its slices fill by relocation)."""
    _ring_change("add", worker_id, job, bootstrap)


@ring_app.command("remove")
def ring_remove(worker_id: Annotated[str, typer.Argument(help="a ring node other than the head")],
                job: JobOpt = None, bootstrap: BootstrapOpt = None) -> None:
    """Take a node out of the ring (its slices move to a neighbour first); then it can be stopped."""
    _ring_change("remove", worker_id, job, bootstrap)
