"""The job file's `output:` section (the results' format and topic) and the names a result
record's own fields take, which stream and field names may not collide with."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from streamjoin.settings.base import StrictModel

RESERVED_RESULT_NAMES = frozenset({"result_id", "event_time", "produced_ms", "inputs"})
AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class OutputSpec(StrictModel):
    """Where and how results are written: one Kafka record per result (json, avro),
    or Arrow IPC blocks of many results for high-rate internal consumers."""

    format: Literal["json", "avro", "blocks"] = Field(
        default="json",
        description="json or avro: one Kafka record per result; blocks: Arrow IPC records of many results, for "
                    "high-rate internal consumers")
    topic: str | None = Field(default=None, description="results topic (default <job>.results)")
