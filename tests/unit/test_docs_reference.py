"""The generated reference pages (ops/docs_reference.py) stay true: they are what the code writes
now, every settings field, command, option and metric has its entry, and the presence checks
fail on an item a page lacks (shown on a synthetic field, command, option and metric)."""

from __future__ import annotations

import sys
import types
import typing
from typing import Annotated, Optional

import pytest
import typer
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, Field
from typer.main import get_command

from tests.unit.test_packaging import REPO

sys.path.insert(0, str(REPO / "ops"))
import docs_reference  # noqa: E402
from refdocs import cli, job_file, metrics  # noqa: E402

from streamjoin.cli import app  # noqa: E402
from streamjoin.cli.common import BootstrapOpt, JobOpt, JsonOpt  # noqa: E402
from streamjoin.settings import JobSettings  # noqa: E402
from streamjoin.settings.base import StrictModel  # noqa: E402

pytestmark = pytest.mark.unit

RUN = "run `python3 ops/docs_reference.py` and commit the pages it writes"


@pytest.fixture(scope="module")
def committed() -> dict[str, str]:
    return {name: (REPO / path).read_text() for name, path in (("job", docs_reference.JOB_FILE_PAGE),
                                                               ("cli", docs_reference.CLI_PAGE),
                                                               ("metrics", docs_reference.METRICS_PAGE))}


@pytest.fixture(scope="module")
def metric_items() -> list[metrics.Metric]:
    return metrics.metrics()


def test_the_pages_are_what_the_code_writes() -> None:
    differ = docs_reference.stale()
    assert not differ, f"the reference pages are stale ({RUN}):\n" + "\n".join(differ)


def test_every_setting_command_option_and_metric_has_an_entry(committed: dict[str, str],
                                                             metric_items: list[metrics.Metric]) -> None:
    assert not job_file.absent_settings(committed["job"], job_file.settings()), RUN
    assert not cli.absent_commands(committed["cli"], cli.commands()), RUN
    assert not metrics.absent_metrics(committed["metrics"], metric_items), RUN
    assert len(metric_items) > 50 and all(m.processes for m in metric_items), \
        "every metric is found, and updated by some service"


def test_a_setting_the_page_lacks_is_named(committed: dict[str, str]) -> None:
    class Knobs(StrictModel):
        depth: int = Field(default=1, description="a nested knob")

    class Synthetic(JobSettings):
        extra_knob: int = Field(default=1, description="a knob the page lacks")
        knobs: Knobs = Field(default=Knobs(), description="a section the page lacks")

    assert job_file.absent_settings(committed["job"], job_file.settings(Synthetic)) == [
        "extra_knob", "knobs", "knobs.depth"]


def test_a_command_or_option_the_page_lacks_is_named(committed: dict[str, str]) -> None:
    synthetic = typer.Typer()

    @synthetic.command()
    def status(job: JobOpt = None, bootstrap: BootstrapOpt = None, as_json: JsonOpt = False,
               colour: Annotated[bool, typer.Option("--colour", help="paint the table")] = False) -> None:
        """Workers and their groups, in colour."""

    @synthetic.command()
    def frobnicate(level: Annotated[Optional[int], typer.Option(help="how hard")] = None) -> None:
        """A command the page lacks."""

    root, extra = get_command(app), get_command(synthetic)
    root.commands.update(status=extra.commands["status"], frobnicate=extra.commands["frobnicate"])
    assert cli.absent_commands(committed["cli"], cli.commands(root)) == [
        "streamjoin frobnicate", "streamjoin status --colour"]


def test_a_metric_the_page_lacks_is_named(committed: dict[str, str], metric_items: list[metrics.Metric]) -> None:
    module = types.ModuleType("synthetic_metrics")
    module.REGISTRY = CollectorRegistry()  # type: ignore[attr-defined]
    module.THINGS = Counter("streamjoin_synthetic_things", "Things the page lacks", ["kind"],  # type: ignore[attr-defined]
                            registry=module.REGISTRY)  # type: ignore[attr-defined]
    assert metrics.absent_metrics(committed["metrics"], metrics.metrics([module])) == [
        "streamjoin_synthetic_things_total"]
    first = metric_items[0].name
    without = "\n".join(line for line in committed["metrics"].splitlines() if f"`{first}`" not in line)
    assert metrics.absent_metrics(without, metric_items) == [first]


def _fields(model: type[BaseModel], prefix: str = "") -> typing.Iterator[tuple[str, typing.Any]]:
    """Every field of `model` and of the models it holds, the undocumented ones included."""
    for name, field in model.model_fields.items():
        yield prefix + name, field
        sub, many = job_file.model_of(field.annotation)
        if sub is not None:
            yield from _fields(sub, f"{prefix}{name}{'[]' if many else ''}.")


def _params(command: typing.Any, path: str = "streamjoin") -> typing.Iterator[tuple[str, typing.Any, typing.Any]]:
    """(path, command, parameter or None) for every command of the click tree and each of its parameters."""
    yield path, command, None
    for p in command.params:
        yield path, command, p
    for name, sub in getattr(command, "commands", {}).items():
        yield from _params(sub, f"{path} {name}")


def test_every_field_option_and_metric_says_what_it_is(metric_items: list[metrics.Metric]) -> None:
    bare = [path for path, field in _fields(JobSettings) if not (field.description or "").strip()]
    assert not bare, f"give these settings a Field(description=...): {bare}"
    silent = [f"{path} {' '.join(p.opts) if p is not None else ''}".strip()
              for path, command, p in _params(get_command(app))
              if not ((command.help if p is None else getattr(p, "help", None)) or "").strip()]
    assert not silent, f"give these commands and options help text: {silent}"
    assert not [m.name for m in metric_items if not m.help.strip()], "every metric has help text"
