"""What every tier shares: the Hypothesis profile, the tier markers, and one Spark per test process."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pytest

import tests.profiles  # noqa: F401  (loads the Hypothesis profile named by HYPOTHESIS_PROFILE)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The suite's Spark jobs read a few thousand records and end within seconds, before the JVM's
# optimising compiler pays back: its quick compiler alone (C1) and the serial collector cost
# about a fifth less CPU for the same jobs (measured on the Spark verify tests), and the suite
# is CPU-bound. The test processes and all they start (benchmark and CLI subprocesses) inherit
# it; a user's own runs, and the benchmarks' published figures, keep the JVM's defaults.
os.environ.setdefault("PYSPARK_SUBMIT_ARGS",
                      "--driver-java-options '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC' pyspark-shell")
# Most of a test's fleet time is spent idle, waiting on a condition, and an idle consumer costs the
# embedded broker CPU at every empty fetch, in proportion to the partitions it names: a 60-partition
# fleet of two workers kept Tansu 66% busy at the default 20 ms wait and 24% at 100 ms (measured),
# with a median hop of 13 against 17 ms. Every job the suite loads (here and in the processes it
# starts) waits 100 ms; the benchmarks' published figures keep the default.
os.environ.setdefault("STREAMJOIN_CONSUMERS__FETCH_WAIT_MS", "100")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local Spark for the whole run: starting a JVM costs seconds."""
    from streamjoin.services.spark.kafka_source import local_session

    session = local_session("streamjoin-tests")
    yield session
    session.stop()


TIERS = ("unit", "integration", "bench", "fuzz", "spark")


def tier_of(item: pytest.Item) -> str:
    """The one tier a test belongs to: bench (a `streamjoin bench --quick` run, marked so by its
    module), fuzz, spark (starts a JVM: marked, or uses the `spark` fixture), integration (real
    services on a broker: marked, or under tests/integration), else unit (in-process, seconds)."""
    for tier in ("bench", "fuzz", "spark", "integration"):
        if item.get_closest_marker(tier) is not None:
            return tier
    if "spark" in getattr(item, "fixturenames", ()):
        return "spark"
    return "integration" if "integration" in Path(str(item.path)).parts else "unit"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns xdist_group marks into scheduling groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))
        # One JVM per run, not one per xdist worker: tests that share the in-process Spark run
        # on the same worker (`--dist loadgroup`). Benchmarks run one at a time: each starts its
        # own broker, fleet and often a Spark JVM, and two at once would starve each other.
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))
        elif tier == "bench":
            item.add_marker(pytest.mark.xdist_group("bench"))
        elif uses_module_fixture(item):
            # A module-scoped fixture (a broker and fleet run once for several tests) is set up
            # once per worker process: its tests stay together, or each worker would run it again.
            item.add_marker(pytest.mark.xdist_group(f"module:{item.module.__name__}"))  # type: ignore[attr-defined]


def uses_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(d.scope in ("module", "package", "class")
                                    for defs in info.name2fixturedefs.values() for d in defs)


def pytest_configure(config: pytest.Config) -> None:
    """Ports handed to services are claimed in one folder for the whole run, so test processes
    running side by side (pytest-xdist) never hand out the same port (services/broker.free_port)."""
    if "STREAMJOIN_PORT_CLAIMS" not in os.environ and not hasattr(config, "workerinput"):
        os.environ["STREAMJOIN_PORT_CLAIMS"] = tempfile.mkdtemp(prefix="streamjoin-ports-")
