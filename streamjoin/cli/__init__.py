"""`streamjoin`: one CLI for every service and job.

Every command reads the same typed settings (job file, then STREAMJOIN_*
environment, then flags). Bad settings or flags exit with code 2 and a
message that names the field.
"""

from __future__ import annotations

import typer

from streamjoin.cli import bench, fleet, jobs, marks, queries, run, spark

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
app.add_typer(jobs.topics_app, name="topics")
app.add_typer(jobs.plan_app, name="plan")
app.add_typer(fleet.ring_app, name="ring")
app.add_typer(marks.splitjoin_app, name="splitjoin")
app.add_typer(jobs.schema_app, name="schema")
app.add_typer(queries.query_app, name="query")
for command in (run.broker, run.worker, run.queries, run.merger, run.coordinator, fleet.status, fleet.move,
                fleet.drain, fleet.rebalance, spark.sources, spark.verify, spark.demo, bench.bench):
    app.command()(command)
