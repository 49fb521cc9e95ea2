"""What a job is made of, before and beside its services: its topics (create, check),
the cost-model plan of a ring job, and the schema of the results it writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from streamjoin.cli.common import BootstrapOpt, JobOpt, JsonOpt, cluster_of, console, job_settings
from streamjoin.settings import JobSettings

if TYPE_CHECKING:
    from streamjoin.topology import topics

topics_app = typer.Typer(no_args_is_help=True, help="Create or check the job's topics.")
plan_app = typer.Typer(no_args_is_help=True, help="Cost-model plans.")
schema_app = typer.Typer(no_args_is_help=True, help="Schemas of what the job writes.")


@topics_app.command("create")
def topics_create(job: JobOpt = None, bootstrap: BootstrapOpt = None) -> None:
    """Create the job's topics (missing ones) and check the existing ones."""
    from streamjoin.topology import topics

    s = job_settings(job, bootstrap=bootstrap)
    created = topics.ensure(cluster_of(s).admin(), s)
    console.print(f"created {len(created)} topic(s): {', '.join(created) or '-'}; all {len(topics.plan(s))} ok")


@topics_app.command("check")
def topics_check(job: JobOpt = None, bootstrap: BootstrapOpt = None, as_json: JsonOpt = False) -> None:
    """Report topic settings that endanger recovery or exactness; exit 1 on any danger.

    Missing topics, partition counts, cleanup policy, retention, replication and
    min.insync.replicas, as the cluster reports them (checks a broker cannot answer are listed as not run)."""
    from confluent_kafka import KafkaException

    from streamjoin.topology import topics

    s = job_settings(job, bootstrap=bootstrap)
    try:
        report = topics.audit(cluster_of(s).admin(), s)
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


@plan_app.command("ring")
def plan_ring(
    job_file: Annotated[Path, typer.Argument(help="YAML job file of a ring-mode job")],
    bootstrap: BootstrapOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """PSP cost model (eqs. 1-5): predicted service rate and latency per ring size N."""
    from streamjoin.services.coordinator.ring_plan import plan_ring as make_plan, render_plan

    s = job_settings(job_file, bootstrap=bootstrap)
    if s.join.mode != "ring":
        console.print(f"[red]error:[/red] {job_file} has join.mode={s.join.mode!r}; `plan ring` needs join.mode: ring")
        raise typer.Exit(2)
    plan = make_plan(s, cluster_of(s) if s.bootstrap else None)
    if as_json:
        print(json.dumps(plan, indent=2))
    else:
        render_plan(plan, Console())


@schema_app.command("results")
def schema_results(job: JobOpt = None) -> None:
    """Print the Avro schema (.avsc) of the job's result records (output.format avro)."""
    from streamjoin.schemas.result_format import result_layout, results_avro_schema

    print(json.dumps(results_avro_schema(result_layout(job_settings(job))), indent=2))
