"""Where Spark's own output goes: to a log file, never to the terminal the jobs
report on.

Spark writes to the terminal from three places, none of which a log level
alone silences (measured, PySpark 4.3 local mode): the JVM itself ("WARNING:
Using incubator modules" before any logger exists), log4j2's console appender
(Spark's default profile, WARN lines before and after setLogLevel) and the
Python workers, whose stderr (tracebacks, warnings) the JVM copies to its own.
So the JVM is started with its stdout and stderr on the file
(pyspark.java_gateway.launch_gateway's popen_kwargs), which catches all three;
log4j keeps its level (`SPARK_LOG_LEVEL`). On the driver, py4j's logger and
Python warnings go to the same file. PySpark runs one JVM per process, so the
first Spark a process starts decides the file.
"""

from __future__ import annotations

# Stdlib logging, not structlog: it only routes py4j's and Python warnings' own stdlib loggers
# to the Spark log file; the project's messages go through structlog.
import logging
import os
import subprocess
import tempfile
from pathlib import Path

from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway

SPARK_LOG_LEVEL = "WARN"
_DRIVER_LOGGERS = ("py4j", "py.warnings")  # py.warnings: Python warnings, once logging captures them
_log_path: Path | None = None


def default_log_path() -> Path:
    """A log file of this process's own, when the caller names none."""
    return Path(tempfile.gettempdir()) / f"streamjoin-spark-{os.getpid()}.log"


def spark_log_path() -> Path | None:
    """The file this process's Spark JVM logs to (None: none started by `start_context`)."""
    return _log_path


def start_context(conf: SparkConf, log_path: Path) -> SparkContext:
    """Starts a SparkContext with `conf`. The first in this process starts Spark's JVM with
    everything it prints appended to `log_path`, and sends the driver's py4j and warnings
    output there too; later ones (after a stop) run in that JVM, logging where it does.

    conf: the Spark settings (master, app name, ...), applied before the JVM starts.
    log_path: the log file (created with its folder if missing)."""
    global _log_path
    gateway = None  # None: the JVM this process already runs (PySpark keeps one per process)
    if SparkContext._gateway is None:
        _log_path = log_path.resolve()  # named in reports: valid from any working directory
        _log_path.parent.mkdir(parents=True, exist_ok=True)
        with _log_path.open("ab") as sink:  # the JVM gets its own copy of the descriptor
            gateway = launch_gateway(conf, popen_kwargs={"stdout": sink, "stderr": subprocess.STDOUT})
        _driver_output_to(_log_path)
    context = SparkContext(conf=conf, gateway=gateway)
    context.setLogLevel(SPARK_LOG_LEVEL)
    return context


def _driver_output_to(log_path: Path) -> None:
    """py4j's log records and Python warnings (as log records) to `log_path`, not the terminal."""
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.captureWarnings(True)
    for name in _DRIVER_LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False  # else a root handler on stderr (logs.configure) prints them as well
