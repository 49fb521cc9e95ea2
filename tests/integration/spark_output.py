"""What Spark (and Python's warnings) print when their output reaches a terminal,
so tests can say none does."""

from __future__ import annotations

import re

# log4j lines in Spark's default pattern (`26/11/22 20:56:50 WARN Utils: ...`), the default
# profile's banner and the JVM's own start-up warning.
_SPARK_LINE = re.compile(r"^(\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR) "
                         r"|Using Spark's default log4j profile|WARNING: Using incubator modules"
                         r"|Setting default log level to)", re.MULTILINE)
# Python's warning format: `path:line: SomeWarning: message`.
_PYTHON_WARNING = re.compile(r"^\S+:\d+: \w*Warning: ")
_LOG_NAMED = re.compile(r"^Spark logs: (\S+)$", re.MULTILINE)


def spark_lines(text: str) -> list[str]:
    """The lines of `text` that Spark or its JVM printed."""
    return [line for line in text.splitlines() if _SPARK_LINE.match(line)]


def noise(text: str) -> list[str]:
    """The lines of `text` that Spark, its JVM or Python's warnings printed."""
    return spark_lines(text) + [line for line in text.splitlines() if _PYTHON_WARNING.match(line)]


def named_log(stderr: str) -> str:
    """The Spark log file a command names on stderr ("Spark logs: <path>")."""
    found = _LOG_NAMED.search(stderr)
    assert found, f"no 'Spark logs:' line in {stderr[-2000:]!r}"
    return found.group(1)
