"""The shared set-up of one benchmark run: a fresh embedded broker (Tansu keeps
every record until it exits, so each run gets its own), a scratch directory,
one local Spark (the JVM starts once and serves `sources`, `verify` and the
Spark peer) and progress lines on stderr (stdout carries the JSON)."""

from __future__ import annotations

import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from rich.console import Console

from streamjoin.services import broker as embedded
from streamjoin.services.io.kafka import Cluster

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class BenchEnv:
    workdir: Path
    bootstrap: str
    stack: ExitStack
    console: Console = field(default_factory=lambda: Console(stderr=True, soft_wrap=True))

    @property
    def cluster(self) -> Cluster:
        """The run's embedded broker (no client settings: it is plain loopback)."""
        return Cluster(self.bootstrap)

    @cached_property
    def spark(self) -> "SparkSession":
        from streamjoin.services.spark.kafka_source import local_session

        return local_session("streamjoin-bench")

    @contextmanager
    def phase(self, what: str) -> Iterator[None]:
        """Prints what runs and, when it is done, how long it took."""
        self.console.print(f"[bold cyan]bench[/] {what} ...")
        began = time.monotonic()
        yield
        self.console.print(f"[bold cyan]bench[/] {what}: done in {time.monotonic() - began:.0f}s")


@contextmanager
def bench_env() -> Iterator[BenchEnv]:
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="streamjoin-bench-")))
        broker = embedded.start(log_path=workdir / "broker.log")
        stack.callback(broker.stop)
        # Before the broker stops: a broker stopped with clients still connected (Spark's Kafka
        # source and sink keep theirs) takes seconds to exit.
        stack.callback(_stop_spark)
        yield BenchEnv(workdir, broker.bootstrap, stack)


def _stop_spark() -> None:
    """Stop this process's Spark, if a bench started one."""
    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
