"""What every command group shares: the error console, the --job/--bootstrap/--metrics-port
options, loading the job's settings (exit 2 on a bad one), its Kafka cluster, the control
topic, and the check that an optional extra (spark, bench) is installed."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from streamjoin.job_files import default_job_file
from streamjoin.settings import JobSettings, SettingsError, load

if TYPE_CHECKING:
    from streamjoin.services.io.kafka import Cluster

console = Console(stderr=True, soft_wrap=True)

JobOpt = Annotated[Optional[Path], typer.Option("--job", help="YAML job file (default: the equi-join demo job)")]
BootstrapOpt = Annotated[
    Optional[str], typer.Option("--bootstrap", envvar="STREAMJOIN_BOOTSTRAP", help="Kafka bootstrap servers")
]
PortOpt = Annotated[Optional[int], typer.Option("--metrics-port", help="/metrics and /healthz port (0 = any)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]

# The optional dependencies each extra brings (pyproject's [project.optional-dependencies]).
EXTRAS: dict[str, tuple[str, ...]] = {"spark": ("pyspark", "matplotlib"), "bench": ("psutil", "matplotlib", "pyspark")}


def job_settings(job: Path | None, **flags: object) -> JobSettings:
    """The job's settings (job file, then STREAMJOIN_* environment, then `flags`); exit 2 naming the field."""
    try:
        return load(job or default_job_file(), **flags)
    except SettingsError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from e


def cluster_of(settings: JobSettings) -> "Cluster":
    """The job's Kafka cluster (bootstrap and `kafka:` client settings); exit 2 when none is given."""
    from streamjoin.services.io.kafka import Cluster

    if not settings.bootstrap:
        console.print("[red]error:[/red] no Kafka cluster given: pass --bootstrap HOST:PORT (or set "
                      "STREAMJOIN_BOOTSTRAP); `streamjoin broker` starts a local one")
        raise typer.Exit(2)
    return Cluster.of(settings)


def need_splitjoin(s: JobSettings, command: str) -> None:
    if s.join.mode != "splitjoin":
        console.print(f"[red]error:[/red] job {s.job} has join.mode={s.join.mode!r}; `{command}` needs join.mode: splitjoin")
        raise typer.Exit(2)


def send_control(s: JobSettings, message: object, key: bytes) -> None:
    """Write `message` (a schemas.control model) to the job's control topic; exit 1 if the broker does not take it."""
    from streamjoin.schemas import control

    p = cluster_of(s).producer()
    p.produce(s.control_topic, value=control.encode(message), key=key, partition=0)  # type: ignore[arg-type]
    if p.flush(30):
        console.print("[red]error:[/red] the broker did not take the request within 30 s")
        raise typer.Exit(1)


def _missing_extra(extra: str, module: str) -> typer.Exit:
    console.print(f"[red]error:[/red] this command needs {module}, which the `{extra}` extra installs: "
                  + escape(f"pip install 'streamjoin[{extra}]'"))
    return typer.Exit(2)


def require_extra(extra: str, *modules: str) -> None:
    """Exit 2 naming `extra` when one of `modules` (default: all the extra brings) is not installed:
    the workers' install leaves the Spark jobs' and the benchmarks' dependencies out."""
    for module in modules or EXTRAS[extra]:
        if importlib.util.find_spec(module) is None:
            raise _missing_extra(extra, module)


@contextmanager
def extra_needed(extra: str) -> Iterator[None]:
    """Turn an import of a module that `extra` brings, failing inside the block, into exit 2 naming
    the extra (the modules a run needs are imported only when it gets to them)."""
    try:
        yield
    except ModuleNotFoundError as e:
        top = (e.name or "").partition(".")[0]
        if top not in EXTRAS[extra]:
            raise
        raise _missing_extra(extra, top) from e
