"""`streamjoin`: one CLI for every service and job.

Every command reads the same typed settings (job file, then STREAMJOIN_*
environment, then flags). Bad settings or flags exit with code 2 and a
message that names the field.
"""

from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from streamjoin import logs
from streamjoin.settings import JobSettings, SettingsError, load

if TYPE_CHECKING:
    from streamjoin.services.kafka import Cluster
    from streamjoin.topology import topics

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
topics_app = typer.Typer(no_args_is_help=True, help="Create or check the job's topics.")
app.add_typer(topics_app, name="topics")
plan_app = typer.Typer(no_args_is_help=True, help="Cost-model plans.")
app.add_typer(plan_app, name="plan")
ring_app = typer.Typer(no_args_is_help=True, help="Resize a PSP ring (ring mode jobs).")
app.add_typer(ring_app, name="ring")
splitjoin_app = typer.Typer(no_args_is_help=True, help="Scale SplitJoin cores, move idle partitions (splitjoin jobs).")
app.add_typer(splitjoin_app, name="splitjoin")
schema_app = typer.Typer(no_args_is_help=True, help="Schemas of what the job writes.")
app.add_typer(schema_app, name="schema")
query_app = typer.Typer(no_args_is_help=True, help="Continuous queries through the query service's HTTP API "
                                                    "(`streamjoin queries` serves it).")
app.add_typer(query_app, name="query")
console = Console(stderr=True, soft_wrap=True)

JobOpt = Annotated[Optional[Path], typer.Option("--job", help="YAML job file (default: the seed-000 demo job)")]
BootstrapOpt = Annotated[
    Optional[str], typer.Option("--bootstrap", envvar="STREAMJOIN_BOOTSTRAP", help="Kafka bootstrap servers")
]
PortOpt = Annotated[Optional[int], typer.Option("--metrics-port", help="/metrics and /healthz port (0 = any)")]


def default_job_file() -> Path:
    return Path(str(resources.files("streamjoin") / "jobs" / "seed000.yaml"))


def _settings(job: Path | None, **flags: object) -> JobSettings:
    try:
        return load(job or default_job_file(), **flags)
    except SettingsError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from e


def _check_ring_job(settings: JobSettings) -> None:
    """UDFs are imported at start: an unknown or unimportable one fails fast with exit code 2."""
    from streamjoin.engine.predicates import PredicateError, compile_terms

    try:
        compile_terms([st.name for st in settings.streams], settings.join.predicate, settings.join.udfs)
    except PredicateError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from e


def _cluster(settings: JobSettings) -> "Cluster":
    """The job's Kafka cluster (bootstrap and `kafka:` client settings); exit 2 when none is given."""
    from streamjoin.services.kafka import Cluster

    if not settings.bootstrap:
        console.print("[red]error:[/red] no Kafka cluster given: pass --bootstrap HOST:PORT (or set "
                      "STREAMJOIN_BOOTSTRAP); `streamjoin broker` starts a local one")
        raise typer.Exit(2)
    return Cluster.of(settings)


@app.command()
def broker(port: Annotated[int, typer.Option(help="loopback port (0 = any free port)")] = 0) -> None:
    """Start the embedded Kafka-compatible broker (Tansu, memory only) and wait.

    SIGTERM or Ctrl-C stops it and its Tansu child (which dies with this process even on
    SIGKILL: services/broker.py); exits 0 then, 1 if Tansu ended on its own."""
    from streamjoin.services import broker as embedded
    from streamjoin.services.shutdown import Stopped, raise_on_signals

    raise_on_signals()
    try:
        with embedded.start(port or None) as b:  # a stop while it starts: Tansu's death signal ends it
            print(b.bootstrap, flush=True)
            console.print(f"broker ready at {b.bootstrap}; Ctrl-C stops it (its records go with it)")
            code = b.process.wait()
    except Stopped:
        console.print("broker stopped")
        return
    console.print(f"[red]error:[/red] the broker exited on its own with code {code}")
    raise typer.Exit(1)


@topics_app.command("create")
def topics_create(job: JobOpt = None, bootstrap: BootstrapOpt = None) -> None:
    """Create the job's topics (missing ones) and check the existing ones."""
    from streamjoin.topology import topics

    s = _settings(job, bootstrap=bootstrap)
    created = topics.ensure(_cluster(s).admin(), s)
    console.print(f"created {len(created)} topic(s): {', '.join(created) or '-'}; all {len(topics.plan(s))} ok")


@topics_app.command("check")
def topics_check(job: JobOpt = None, bootstrap: BootstrapOpt = None,
                 as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False) -> None:
    """Report topic settings that endanger recovery or exactness; exit 1 on any danger.

    Missing topics, partition counts, cleanup policy, retention, replication and
    min.insync.replicas, as the cluster reports them (checks a broker cannot answer are listed as not run)."""
    from confluent_kafka import KafkaException

    from streamjoin.topology import topics

    s = _settings(job, bootstrap=bootstrap)
    try:
        report = topics.audit(_cluster(s).admin(), s)
    except KafkaException as e:  # no metadata: nothing can be checked, so nothing is vouched for
        console.print(f"[red]error:[/red] the cluster at {s.bootstrap} did not answer: {e}")
        raise typer.Exit(1) from e
    if as_json:
        print(json.dumps({"job": s.job} | report.to_json(), indent=2))
    else:
        _print_topic_report(s, report)
    raise typer.Exit(1 if report.dangerous else 0)


def _print_topic_report(settings: JobSettings, report: topics.Report) -> None:
    """`report` as rich tables on stdout: findings, then the checks that could not run."""
    out = Console()
    if report.findings:
        table = Table(title=f"job {settings.job}: topic settings ({report.brokers} broker(s))")
        for col in ("severity", "topic", "role", "check", "detail"):
            table.add_column(col, overflow="fold")
        for f in report.findings:
            colour = "red" if f.severity == "danger" else "yellow"
            table.add_row(f"[{colour}]{f.severity}[/{colour}]", f.topic, f.role, f.check, f.detail)
        out.print(table)
    if report.not_run:
        table = Table(title="checks that could not run")
        for col in ("check", "topics", "reason"):
            table.add_column(col, overflow="fold")
        for n in report.not_run:
            table.add_row(n.check, ", ".join(n.topics), n.reason)
        out.print(table)
    dangers = sum(f.severity == "danger" for f in report.findings)
    out.print(f"{dangers} danger(s), {len(report.findings) - dangers} warning(s), "
              f"{sum(len(n.topics) for n in report.not_run)} check(s) not run")


@app.command()
def worker(
    worker_id: Annotated[str, typer.Option("--worker-id", help="stable id; keeps its RocksDB state across restarts")],
    job: JobOpt = None, bootstrap: BootstrapOpt = None, metrics_port: PortOpt = None,
    core: Annotated[Optional[int], typer.Option("--core", help="splitjoin mode: this core's position (0..max_cores-1)")]
    = None,
) -> None:
    """Run a join worker (hash-partitioned, PSP ring node or SplitJoin core, as the job says)."""
    s = _settings(job, bootstrap=bootstrap)
    logs.configure("worker", worker=worker_id)
    if s.join.mode == "splitjoin":
        if core is None or not 0 <= core < s.splitjoin.max_cores:
            console.print(f"[red]error:[/red] --core: a splitjoin worker needs its position 0..{s.splitjoin.max_cores - 1} "
                          f"(splitjoin.max_cores), got {core}")
            raise typer.Exit(2)
        _check_ring_job(s)
        from streamjoin.services.splitjoin.core import run_core

        run_core(s, _cluster(s), core, worker_id, metrics_port)
    elif s.join.mode == "ring":
        from streamjoin.services.worker.ring import run_ring_worker

        _check_ring_job(s)
        run_ring_worker(s, _cluster(s), worker_id, metrics_port)
    else:
        from streamjoin.services.worker.main import run_worker

        run_worker(s, _cluster(s), worker_id, metrics_port)


@app.command()
def queries(job: JobOpt = None, bootstrap: BootstrapOpt = None,
            work_dir: Annotated[Path, typer.Option(help="operator versions' job files and logs")] = Path("out/queries"),
            port: Annotated[Optional[int], typer.Option(help="the HTTP API's port (default queries.port)")] = None,
            ) -> None:
    """Run the continuous-query service (seed 002): the HTTP API, the planner, the router; it
    runs each shared operator's versions as local hash-mode fleets."""
    s = _settings(job, bootstrap=bootstrap, queries={"port": port} if port is not None else {})
    logs.configure("queries")
    from streamjoin.launcher import FleetDeployer
    from streamjoin.services.queries.main import serve

    cluster = _cluster(s)
    serve(s, cluster, FleetDeployer(cluster.bootstrap, work_dir))


@app.command()
def merger(job: JobOpt = None, bootstrap: BootstrapOpt = None, metrics_port: PortOpt = None) -> None:
    """Run the SplitJoin merger: the cores' results into the results topic, in input order."""
    s = _settings(job, bootstrap=bootstrap)
    _need_splitjoin(s, "merger")
    from streamjoin.services.splitjoin.merger import run_merger

    logs.configure("merger")
    run_merger(s, _cluster(s), metrics_port)


def _need_splitjoin(s: JobSettings, command: str) -> None:
    if s.join.mode != "splitjoin":
        console.print(f"[red]error:[/red] job {s.job} has join.mode={s.join.mode!r}; `{command}` needs join.mode: splitjoin")
        raise typer.Exit(2)


def _write_marks(s: JobSettings, mark: object) -> int:
    """One copy of `mark` in every partition of every source topic; returns how many were written."""
    from streamjoin.schemas.splitjoin import mark_headers

    cluster = _cluster(s)
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

    s = _settings(job, bootstrap=bootstrap)
    _need_splitjoin(s, "splitjoin scale")
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

    s = _settings(job, bootstrap=bootstrap)
    _need_splitjoin(s, "splitjoin tick")
    at = int(time.time() * 1000) if ts is None else ts
    if not 0 <= at < 1 << 60:
        console.print(f"[red]error:[/red] --ts must be an epoch time in ms, got {at}")
        raise typer.Exit(2)
    written = _write_marks(s, TickMark(ts=at))
    console.print(f"tick to {at} written to {written} source partitions")


@app.command()
def coordinator(job: JobOpt = None, bootstrap: BootstrapOpt = None, metrics_port: PortOpt = None) -> None:
    """Run the coordinator: placement, heartbeats, assignments."""
    from streamjoin.services.coordinator.main import run_coordinator

    s = _settings(job, bootstrap=bootstrap)
    logs.configure("coordinator")
    run_coordinator(s, _cluster(s), metrics_port)


@app.command()
def status(job: JobOpt = None, bootstrap: BootstrapOpt = None,
           as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False) -> None:
    """Workers, their partition groups, lag, window state size and spill (memory against the
    budget, bytes on disk, generations, clean-up backlog)."""
    from streamjoin.services.coordinator.status import snapshot

    s = _settings(job, bootstrap=bootstrap)
    snap = snapshot(s, _cluster(s))
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
    _send_control(s, request, b"request")


def _send_control(s: JobSettings, message: object, key: bytes) -> None:
    """Write `message` (a schemas.control model) to the job's control topic; exit 1 if the broker does not take it."""
    from streamjoin.schemas import control

    p = _cluster(s).producer()
    p.produce(s.control_topic, value=control.encode(message), key=key, partition=0)  # type: ignore[arg-type]
    if p.flush(30):
        console.print("[red]error:[/red] the broker did not take the request within 30 s")
        raise typer.Exit(1)


def _wait_for(s: JobSettings, done, what: str, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    """Poll `streamjoin status` until `done(snapshot)`; exit 1 naming `what` after `timeout_s`."""
    import time

    from streamjoin.services.coordinator.status import snapshot

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = snapshot(s, _cluster(s))
        if done(snap):
            print(json.dumps({"done": what, "epoch": snap["epoch"]}))
            return
        time.sleep(1)
    console.print(f"[red]error:[/red] {what}: not done within {timeout_s:.0f} s (see the coordinator's log: a "
                  "refused request says why)")
    raise typer.Exit(1)


WaitOpt = Annotated[float, typer.Option("--wait", help="seconds to wait for it to finish (0: do not wait)")]


@app.command()
def move(group: Annotated[int, typer.Argument(help="the partition group to move")],
         to: Annotated[str, typer.Option("--to", help="the live worker to move it to")],
         job: JobOpt = None, bootstrap: BootstrapOpt = None, wait: WaitOpt = 120.0) -> None:
    """Move a partition group to another worker, live and exactly (the migration protocol)."""
    from streamjoin.schemas import control

    s = _settings(job, bootstrap=bootstrap)
    if not 0 <= group < s.partitions:
        console.print(f"[red]error:[/red] GROUP must be in 0..{s.partitions - 1} (the job's partitions)")
        raise typer.Exit(2)
    _placement_request(s, control.MoveGroup(group=group, to=to))
    if wait > 0:
        _wait_for(s, lambda snap: any(w["worker"] == to and group in w["held_groups"] for w in snap["workers"])
                  and not any(m["group"] == group for m in snap["moving"]), f"group {group} on {to}", wait)


@app.command()
def drain(worker_id: Annotated[str, typer.Argument(help="the worker to move every group off")],
          job: JobOpt = None, bootstrap: BootstrapOpt = None, wait: WaitOpt = 300.0) -> None:
    """Move every partition group off a worker (before maintenance); it is given none after."""
    from streamjoin.schemas import control

    s = _settings(job, bootstrap=bootstrap)
    _placement_request(s, control.DrainWorker(worker=worker_id))
    if wait > 0:
        _wait_for(s, lambda snap: all(not (w["placed_groups"] or w["held_groups"]) for w in snap["workers"]
                                      if w["worker"] == worker_id) and not snap["moving"],
                  f"{worker_id} drained", wait)


@app.command()
def rebalance(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print what the adaptive policy would do now")] = False,
    job: JobOpt = None, bootstrap: BootstrapOpt = None,
    seed: Annotated[Optional[int], typer.Option(help="seed of the random group choice (default: unseeded)")] = None,
) -> None:
    """What the coordinator's adaptive policy would do now, and why (hash mode): each worker's
    occupancy, role, state bytes and spill, and the planned moves, scale change or active-disk
    push order (seed 003 6), as JSON.

    Only --dry-run exists (exit 2 without it): with `coordinator.placement: adaptive` the
    coordinator starts the policy's moves itself; `streamjoin move` and `drain` move groups by hand."""
    s = _settings(job, bootstrap=bootstrap)
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

    print(json.dumps(read_dry_run(s, _cluster(s), random.Random(seed)), indent=2))


def _name_spark_log() -> None:
    """Spark's own output is in a file, not on the terminal: say which."""
    from streamjoin.services.spark.session import spark_log_path

    console.print(f"Spark logs: {spark_log_path()}")


@app.command()
def sources(job: JobOpt = None, bootstrap: BootstrapOpt = None,
            seconds: Annotated[Optional[float], typer.Option(min=0.1)] = None,
            rate: Annotated[Optional[float], typer.Option(min=0.1, help="tuples/s per stream")] = None) -> None:
    """Spark Structured Streaming job writing the job's workload (equijoin, band or images) into its input topics."""
    from streamjoin.services.spark.sources import run_sources

    s = _settings(job, bootstrap=bootstrap)
    print(json.dumps(run_sources(s, _cluster(s), seconds=seconds, rate=rate), indent=2))
    _name_spark_log()


@app.command()
def verify(job: JobOpt = None, bootstrap: BootstrapOpt = None,
           report: Annotated[Optional[Path], typer.Option(help="write the report JSON here")] = None,
           plot: Annotated[Optional[Path], typer.Option(help="write the delay plot PNG here")] = None) -> None:
    """Spark job: exact expected join vs. the results topic; exits 1 on any mismatch."""
    from streamjoin.services.spark.verify import run_verify

    s = _settings(job, bootstrap=bootstrap)
    result = run_verify(s, _cluster(s), report_path=report, plot_path=plot)
    print(json.dumps(result, indent=2))
    _name_spark_log()
    raise typer.Exit(0 if result["verified"] else 1)


@app.command()
def demo(
    seconds: Annotated[float, typer.Option(min=1, help="how long the sources write")] = 30,
    workers: Annotated[int, typer.Option(min=1, max=16, help="join worker processes")] = 2,
    report: Annotated[Path, typer.Option(help="report JSON path")] = Path("out/report.json"),
    job: JobOpt = None, bootstrap: BootstrapOpt = None,
    rate: Annotated[Optional[float], typer.Option(min=0.1, help="tuples/s per stream")] = None,
    partitions: Annotated[Optional[int], typer.Option(min=1, max=1000, help="partitions of every topic (partition "
                                                      "groups); default: the job's")] = None,
) -> None:
    """End to end: broker, coordinator, workers, Spark sources, drain, Spark verify, report.

    SIGTERM or Ctrl-C stops every process it started (broker included) and exits 0, no report."""
    from streamjoin.demo import run_demo
    from streamjoin.services.shutdown import Stopped, raise_on_signals

    s = _settings(job, bootstrap=bootstrap, partitions=partitions)
    logs.configure("demo", level="WARNING")
    raise_on_signals()
    try:
        result = run_demo(s, seconds=seconds, workers=workers, report_path=report, rate=rate)
    except Stopped:
        console.print("demo stopped; its services and broker are stopped too")
        return
    keys = ("verified", "inputs", "results", "missing", "extra", "duplicates", "dead_letter", "delay_ms", "logs")
    print(json.dumps({k: result.get(k) for k in keys} | {"report": str(report)}, indent=2))
    raise typer.Exit(0 if result["verified"] else 1)


@plan_app.command("ring")
def plan_ring(
    job_file: Annotated[Path, typer.Argument(help="YAML job file of a ring-mode job")],
    bootstrap: BootstrapOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """PSP cost model (seed 004, eqs. 1-5): predicted service rate and latency per ring size N."""
    from streamjoin.services.coordinator.ring_plan import plan_ring as make_plan, render_plan

    s = _settings(job_file, bootstrap=bootstrap)
    if s.join.mode != "ring":
        console.print(f"[red]error:[/red] {job_file} has join.mode={s.join.mode!r}; `plan ring` needs join.mode: ring")
        raise typer.Exit(2)
    plan = make_plan(s, _cluster(s) if s.bootstrap else None)
    if as_json:
        print(json.dumps(plan, indent=2))
    else:
        render_plan(plan, Console())


def _ring_change(action: str, worker_id: str, job: Path | None, bootstrap: str | None) -> None:
    from streamjoin.schemas import control

    s = _settings(job, bootstrap=bootstrap)
    if s.join.mode != "ring":
        console.print(f"[red]error:[/red] job {s.job} has join.mode={s.join.mode!r}; ring commands need join.mode: ring")
        raise typer.Exit(2)
    _send_control(s, control.RingChange(action=action, worker=worker_id), b"ring-change")  # type: ignore[arg-type]
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


@schema_app.command("results")
def schema_results(job: JobOpt = None) -> None:
    """Print the Avro schema (.avsc) of the job's result records (output.format avro)."""
    from streamjoin.schemas.result_codec import result_layout, results_avro_schema

    print(json.dumps(results_avro_schema(result_layout(_settings(job))), indent=2))


@app.command()
def bench(
    workload: Annotated[str, typer.Argument(
        help="equijoin | band | psp | adapt (groups that move: migration, failover, skew, rate ramp) | "
             "delay (production delay at 5,000 tuples/s per stream, 2 workers, per partition count) | "
             "spill (seed 003's spill policies and disk/distributed adaptation, in-process, no broker) | "
             "splitjoin (seed 001: k cores and the merger against the PSP ring, order and precision) | "
             "reuse (seed 002: N airline queries with operator sharing off, exact-only and relaxed)")],
    quick: Annotated[bool, typer.Option("--quick", help="small enough for CI (a minute or two)")] = False,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="write the result JSON here")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="write the curve PNG here")] = None,
    nodes: Annotated[Optional[str], typer.Option(
        "--nodes", help="band only: ring sizes as a comma list (e.g. 1,2,4), run as a scaling curve on the time "
                        "window; the JSON's `scaling` gives each N's sustained tuples/s and its ratio to N=1")] = None,
    durability: Annotated[bool, typer.Option(
        "--durability", help="band only: every run again with ring.recovery off; the JSON's `durability` gives "
                             "both rates and what crash recovery costs")] = False,
    scale: Annotated[Optional[str], typer.Option(
        "--scale", help="equijoin only: worker counts as a comma list (e.g. 1,2,4,8,12), run instead of the sweep "
                        "as a scale-out curve: one backlog preloaded without Spark, drained with each count; the "
                        "JSON gives tuples/s, speedup, CPU of workers and broker, and the raw-consume limit")] = None,
) -> None:
    """Benchmark a workload against its peers, measured in the same run; exits 1 if our output is not exact.

    SIGTERM or Ctrl-C stops every process it started (broker included) and exits 0, no report."""
    from streamjoin.services.shutdown import Stopped, raise_on_signals

    raise_on_signals()
    try:
        _bench(workload, quick, json_path, plot, nodes, durability, scale)
    except Stopped:
        console.print("bench stopped; its services and broker are stopped too")


def _bench(workload: str, quick: bool, json_path: Path | None, plot: Path | None, nodes: str | None,
           durability: bool, scale: str | None) -> None:
    """`bench` past its signal handling: the run, its JSON and its exit code."""
    from streamjoin.bench import WORKLOADS, run_bench

    options = _bench_options(workload, nodes, durability)
    workers = _scale_option(workload, scale, quick)
    if workers is not None:
        from streamjoin.bench import scale as scale_bench

        options = {"runner": scale_bench.run, "worker_counts": workers}
    elif workload == "spill":  # in-process workers on simulated time: no broker, no Spark
        from streamjoin.bench import report, spill

        result = spill.run(quick, plot)
        if json_path is not None:
            report.write_json(json_path, result)
        print(json.dumps(result, indent=2))
        raise typer.Exit(0 if result.get("exact") else 1)
    if workload not in WORKLOADS:
        console.print(f"[red]error:[/red] unknown workload {workload!r}: choose one of {', '.join(sorted([*WORKLOADS, 'spill']))}")
        raise typer.Exit(2)
    result = run_bench(workload, quick=quick, json_path=json_path, plot_path=plot, **options)
    print(json.dumps(result, indent=2))
    raise typer.Exit(0 if result.get("exact") else 1)


def _bench_options(workload: str, nodes: str | None, durability: bool = False) -> dict:
    """The workload's own keywords from the bench options (nodes: --nodes as typed; durability:
    --durability); a bad value, or an option the workload does not take, exits 2 before anything starts."""
    if nodes is None and not durability:
        return {}
    if workload != "band":
        console.print(f"[red]error:[/red] --nodes and --durability are for `bench band` only, not {workload!r}")
        raise typer.Exit(2)
    from streamjoin.bench.band import parse_nodes

    try:
        return ({"nodes": parse_nodes(nodes)} if nodes is not None else {}) | ({"durability": True} if durability else {})
    except ValueError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


def _scale_option(workload: str, scale: str | None, quick: bool) -> tuple[int, ...] | None:
    """--scale as worker counts (None when not given); a bad value, or a workload other than
    equijoin, exits 2 before anything starts."""
    if scale is None:
        return None
    if workload != "equijoin":
        console.print(f"[red]error:[/red] --scale is for `bench equijoin` only, not {workload!r}")
        raise typer.Exit(2)
    from streamjoin.bench import scale as scale_bench

    try:
        return scale_bench.parse_workers(scale, scale_bench.plan_for(quick).partitions)
    except ValueError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


# ------------------------------------------------------------------ queries

UrlOpt = Annotated[Optional[str], typer.Option(
    "--url", help="the query service's base URL (default: http://queries.host:queries.port of the job)")]
SinkOpt = Annotated[str, typer.Option("--sink", help="the Kafka topic the query's results go to")]
RegionOpt = Annotated[Optional[str], typer.Option("--region", help="the sink's region (default: the first configured)")]
LifetimeOpt = Annotated[Optional[float], typer.Option("--lifetime-s", help="seconds it runs (default: until dropped)")]
SqlArg = Annotated[str, typer.Argument(help="the query, e.g. \"SELECT ... FROM a [RANGE 5 MINUTES], b ... WHERE ...\"")]


def _queries_url(url: str | None, job: Path | None) -> str:
    """`url`, or the job's queries.host:port (a bind-all address asked for on loopback)."""
    if url:
        return url
    spec = _settings(job).queries
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(spec.host, spec.host)
    return f"http://[{host}]:{spec.port}" if ":" in host else f"http://{host}:{spec.port}"


def _query_call(url: str | None, job: Path | None, request):  # type: ignore[no-untyped-def]
    """`request(client)` against the query service; a refusal exits 2 with the service's
    reason, an unreachable or failing service exits 1."""
    from streamjoin.services.queries.client import QueryClient, QueryRefused, ServiceUnavailable

    with QueryClient(_queries_url(url, job)) as client:
        try:
            return request(client)
        except QueryRefused as e:
            _print_refusal(e.reason, e.detail)
            raise typer.Exit(2) from e
        except ServiceUnavailable as e:
            console.print(f"[red]error:[/red] {escape(str(e))} (is `streamjoin queries` running? --url names another)")
            raise typer.Exit(1) from e


def _print_refusal(reason: str, detail: object) -> None:
    """The service's reason, then what its detail pins down: the fields at fault or where in the query."""
    console.print(f"[red]error:[/red] {escape(reason)}", highlight=False)
    if isinstance(detail, list):
        for field in detail:
            if isinstance(field, dict):
                console.print(f"  {field.get('field')}: {field.get('message')}", markup=False, highlight=False)
    elif isinstance(detail, dict) and detail:
        console.print("  " + ", ".join(f"{k} {v!r}" for k, v in detail.items()), markup=False, highlight=False)


@query_app.command("add")
def query_add(sql: SqlArg, sink: SinkOpt, region: RegionOpt = None, lifetime_s: LifetimeOpt = None,
              url: UrlOpt = None, job: JobOpt = None) -> None:
    """Register a continuous query; prints its registration (id, operator, decision) as JSON."""
    view = _query_call(url, job, lambda client: client.add(sql, sink, region, lifetime_s))
    print(json.dumps(view, indent=2))


@query_app.command("list")
def query_list(url: UrlOpt = None, job: JobOpt = None,
               as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False) -> None:
    """Every registered query, running and dropped."""
    views = _query_call(url, job, lambda client: client.list())
    if as_json:
        print(json.dumps(views, indent=2))
        return
    table = Table(title=f"{len(views)} queries, {sum(v['state'] == 'running' for v in views)} running")
    for col in ("id", "state", "sink", "region", "operator", "decision", "lifetime s", "sql"):
        table.add_column(col, overflow="fold")
    for v in views:
        lifetime = "-" if v["lifetime_s"] is None else f"{v['lifetime_s']:g}"
        table.add_row(v["id"], v["state"], v["sink"], v["region"], v["operator"], v["decision"], lifetime, v["sql"])
    Console(markup=False, highlight=False).print(table)  # queries hold [RANGE ...]: not markup


@query_app.command("explain")
def query_explain(
    sql: Annotated[Optional[str], typer.Argument(help="a query to explain without registering it")] = None,
    sink: Annotated[Optional[str], typer.Option("--sink", help="its sink topic (with SQL)")] = None,
    region: RegionOpt = None, lifetime_s: LifetimeOpt = None,
    query_id: Annotated[Optional[str], typer.Option("--id", help="a registered query: the decision recorded for it")]
    = None,
    url: UrlOpt = None, job: JobOpt = None,
) -> None:
    """The planner's decision and its numbers, as JSON.

    For SQL --sink T: what registering it would do (nothing is registered); for --id ID: what was done."""
    if (sql is None) == (query_id is None) or (sql is not None and sink is None):
        console.print("[red]error:[/red] explain takes either SQL with --sink TOPIC, or --id ID")
        raise typer.Exit(2)
    if query_id is not None:
        decision = _query_call(url, job, lambda client: client.explain_query(query_id))
    else:
        decision = _query_call(url, job, lambda client: client.explain(sql, sink, region, lifetime_s))
    print(json.dumps(decision, indent=2))


@query_app.command("drop")
def query_drop(query_id: Annotated[str, typer.Argument(help="the query's id (q-N)")],
               url: UrlOpt = None, job: JobOpt = None) -> None:
    """Stop a query; prints its final registration (end_ms set) as JSON."""
    view = _query_call(url, job, lambda client: client.drop(query_id))
    print(json.dumps(view, indent=2))


@query_app.command("operators")
def query_operators(url: UrlOpt = None, job: JobOpt = None,
                    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False
                    ) -> None:
    """The deployed shared operators and the queries each answers."""
    operators = _query_call(url, job, lambda client: client.operators())
    if as_json:
        print(json.dumps(operators, indent=2))
        return
    table = Table(title=f"{len(operators)} operators")
    for col in ("id", "version", "region", "sources", "queries"):
        table.add_column(col, overflow="fold")
    for o in operators:
        table.add_row(o["id"], str(o["version"]), o["region"], ", ".join(o["sources"]), ", ".join(o["queries"]))
    Console(markup=False, highlight=False).print(table)  # queries hold [RANGE ...]: not markup


if __name__ == "__main__":
    app()
