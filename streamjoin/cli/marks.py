"""SplitJoin's operator commands: marks written into every source partition, so every core
sees them at the same point of the input order (a scale mark changes the number of storage
cores, a tick mark moves idle partitions' event time)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from streamjoin.cli.common import BootstrapOpt, JobOpt, cluster_of, console, job_settings, need_splitjoin
from streamjoin.settings import JobSettings

splitjoin_app = typer.Typer(no_args_is_help=True, help="Scale SplitJoin cores, move idle partitions (splitjoin jobs).")


def _write_marks(s: JobSettings, mark: object) -> int:
    """One copy of `mark` in every partition of every source topic; returns how many were written."""
    from streamjoin.schemas.splitjoin import mark_headers

    cluster = cluster_of(s)
    topics_found = cluster.admin().list_topics(timeout=30).topics
    missing = [t for t in s.input_topics if t not in topics_found]
    if missing:
        console.print(f"[red]error:[/red] source topics {missing} do not exist: run `streamjoin topics create`")
        raise typer.Exit(1)
    producer = cluster.producer()
    written = 0
    for topic in s.input_topics:
        for partition in sorted(topics_found[topic].partitions):
            producer.produce(topic, value=b"", headers=mark_headers(mark), partition=partition)  # type: ignore[arg-type]
            written += 1
    if producer.flush(30):
        console.print("[red]error:[/red] the broker did not take every mark within 30 s; run the command again "
                      "(a repeated mark changes nothing)")
        raise typer.Exit(1)
    return written


@splitjoin_app.command("scale")
def splitjoin_scale(
    cores: Annotated[int, typer.Option("--cores", help="the new number of storage cores k")],
    job: JobOpt = None, bootstrap: BootstrapOpt = None,
) -> None:
    """Switch the storage modulus to k cores at one point of the input order: a scale mark goes into
    every source partition. Start cores k_old..k-1 (`streamjoin worker --core I`) when growing;
    departing cores keep probing until their sub-windows expire, then exit."""
    import uuid

    from streamjoin.schemas.splitjoin import ScaleMark

    s = job_settings(job, bootstrap=bootstrap)
    need_splitjoin(s, "splitjoin scale")
    if not 1 <= cores <= s.splitjoin.max_cores:
        console.print(f"[red]error:[/red] --cores must be 1..splitjoin.max_cores ({s.splitjoin.max_cores}), got {cores}")
        raise typer.Exit(2)
    mark = ScaleMark(id=uuid.uuid4().hex, cores=cores)
    written = _write_marks(s, mark)
    console.print(f"scale mark {mark.id} (k = {cores}) written to {written} source partitions")


@splitjoin_app.command("tick")
def splitjoin_tick(
    ts: Annotated[Optional[int], typer.Option("--ts", help="event time (epoch ms) idle partitions move to; default now")]
    = None,
    job: JobOpt = None, bootstrap: BootstrapOpt = None,
) -> None:
    """Move every source partition's event time to --ts (a tick mark in each): idle partitions stop
    holding the cores' watermark back, the same way on every core. A later record below the tick
    minus the allowed lateness is late."""
    import time

    from streamjoin.schemas.splitjoin import TickMark

    s = job_settings(job, bootstrap=bootstrap)
    need_splitjoin(s, "splitjoin tick")
    at = int(time.time() * 1000) if ts is None else ts
    if not 0 <= at < 1 << 60:
        console.print(f"[red]error:[/red] --ts must be an epoch time in ms, got {at}")
        raise typer.Exit(2)
    written = _write_marks(s, TickMark(ts=at))
    console.print(f"tick to {at} written to {written} source partitions")
