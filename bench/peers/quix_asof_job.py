"""Quix Streams as-of join, run by the as-of bench (bench/asof_peers.py) under Quix's own
Python (quixstreams pins confluent-kafka<2.13, older than this project's, so it lives in a
separate venv and this file imports nothing from the project; it shares quix_job.py's pieces,
which sit beside it on the script's path).

Usage: python quix_asof_job.py SPEC.json. The application reads the stream and table topics
from the beginning under a fresh consumer group, exactly-once, event time from each one's time
field; every value is tagged with its stream's name and its Kafka partition and offset. The
stream is joined with `join_asof` (the table's rows kept in Quix's timestamped store for
`grace_ms`), and each result is written to the output topic as JSON naming its inputs:
stream_partition, stream_offset, table_partition, table_offset (ABSENT, -1, for a left join's
order without a row). It stops once it has processed as many records as the topics hold and
prints one JSON line: `seconds` from the first record processed to the end of the run (the
final exactly-once commit included), `startup_seconds` before the first record, `processed`
and the version.
"""

from __future__ import annotations

import sys
from typing import Callable

from quix_job import run

ABSENT = -1  # a left join's missing row: the refs streamjoin's results carry for it


def merger(stream: str, table: str) -> Callable[[dict, dict | None], dict]:
    """join_asof's on_merge: a result as the refs of its order and its row (ABSENT: none)."""

    def merge(order: dict, row: dict | None) -> dict:
        return {"stream_partition": order[f"{stream}_partition"], "stream_offset": order[f"{stream}_offset"],
                "table_partition": row[f"{table}_partition"] if row else ABSENT,
                "table_offset": row[f"{table}_offset"] if row else ABSENT}

    return merge


def main(spec_path: str) -> None:
    run(spec_path, lambda spec: [spec["stream"], spec["table"]],
        lambda spec, frames: frames[0].join_asof(frames[1], how=spec["how"], grace_ms=spec["grace_ms"],
                                                 on_merge=merger(spec["stream"]["name"], spec["table"]["name"])))


if __name__ == "__main__":
    main(sys.argv[1])
