"""`streamjoin query ...`: continuous queries through the query service's HTTP API (add,
list, explain, drop, operators); a refusal exits 2 with the service's reason, an unreachable
service exits 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from streamjoin.cli.common import JobOpt, JsonOpt, console, job_settings

query_app = typer.Typer(no_args_is_help=True, help="Continuous queries through the query service's HTTP API "
                                                    "(`streamjoin queries` serves it).")

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
    spec = job_settings(job).queries
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
def query_list(url: UrlOpt = None, job: JobOpt = None, as_json: JsonOpt = False) -> None:
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
def query_operators(url: UrlOpt = None, job: JobOpt = None, as_json: JsonOpt = False) -> None:
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
