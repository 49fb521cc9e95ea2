"""Quix Streams interval join, run by `quix_peer` under Quix's own Python
(quixstreams pins confluent-kafka<2.13, older than this project's, so it
lives in a separate venv and this file imports nothing from the project).

Usage: python quix_job.py SPEC.json. The application reads the two input
topics from the beginning under a fresh consumer group, exactly-once, event
time from each stream's time field; every value is renamed to
<stream>_<field> and given its Kafka partition and offset (so each result
names both of its inputs), joined with `join_interval` and written as JSON
to the output topic. It stops once it has processed as many records as the
inputs hold, and prints one JSON line: `seconds` from the first record
processed to the end of the run (the final exactly-once commit included),
`startup_seconds` before the first record, `processed` and the version.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable


class Drain:
    """Counts processed input records; stops the application at the last one."""

    def __init__(self, total: int, stop: Callable[[], None]) -> None:
        """`total`: input records to process; `stop`: called once all are processed."""
        self.total = total
        self.stop = stop
        self.processed = 0
        self.first: float | None = None

    def tick(self) -> None:
        """One record processed (the first one starts the clock)."""
        if self.first is None:
            self.first = time.perf_counter()
        self.processed += 1
        if self.processed == self.total:
            # The current record still runs through the join; the run loop then exits and commits.
            self.stop()


def tagger(stream: str, drain: Drain) -> Callable[[dict], dict]:
    """The apply step of `stream`: fields prefixed with its name, plus its Kafka partition and offset."""
    from quixstreams import message_context

    def tag(value: dict) -> dict:
        ctx = message_context()
        out = {f"{stream}_{k}": v for k, v in value.items()}
        out[f"{stream}_partition"] = ctx.partition
        out[f"{stream}_offset"] = ctx.offset
        drain.tick()
        return out

    return tag


def event_time(field: str) -> Callable[[Any, Any, int, Any], int]:
    """A timestamp extractor reading the stream's event-time field from the JSON value."""
    return lambda value, headers, timestamp, timestamp_type: value[field]


def retention_when_unsaid() -> None:
    """Quix derives its changelog topics' retention from the input topics' `retention.ms` and fails
    when the broker leaves it out of DescribeConfigs, as Tansu does. Tansu keeps every record, so an
    unsaid retention is read as -1 (infinite), which is what it is."""
    from quixstreams.models.topics.admin import TopicAdmin

    inspect = TopicAdmin.inspect_topics

    def inspect_topics(self: TopicAdmin, topic_names: list[str], timeout: float = 30) -> dict:
        configs = inspect(self, topic_names, timeout)
        for config in filter(None, configs.values()):
            config.extra_config.setdefault("retention.ms", "-1")
        return configs

    TopicAdmin.inspect_topics = inspect_topics


def run(spec_path: str, streams: Callable[[dict], list[dict]], join: Callable) -> None:  # type: ignore[type-arg]
    """Run a Quix join application and print its figures (the module docstring's JSON line):
    `streams(spec)` the input specs in join order, `join(spec, frames)` the joined dataframe."""
    began = time.perf_counter()
    from importlib.metadata import version

    from quixstreams import Application
    from quixstreams.models import TopicConfig

    retention_when_unsaid()
    spec = json.loads(Path(spec_path).read_text())
    app = Application(broker_address=spec["bootstrap"], consumer_group=spec["group"],
                      auto_offset_reset="earliest", processing_guarantee="exactly-once",
                      state_dir=spec["state_dir"], loglevel="WARNING",
                      consumer_extra_config=spec["consumer_config"])
    drain = Drain(spec["inputs"], app.stop)
    frames = [app.dataframe(app.topic(s["topic"], timestamp_extractor=event_time(s["time_field"])))
              .apply(tagger(s["name"], drain)) for s in streams(spec)]
    join(spec, frames).to_topic(app.topic(spec["output"], config=TopicConfig(num_partitions=spec["partitions"],
                                                                             replication_factor=1)))
    app.run()
    ended = time.perf_counter()
    first = drain.first if drain.first is not None else ended
    print(json.dumps({"seconds": ended - first, "startup_seconds": first - began, "processed": drain.processed,
                      "version": version("quixstreams")}))


def main(spec_path: str) -> None:
    run(spec_path, lambda spec: spec["streams"],
        lambda spec, frames: frames[0].join_interval(frames[1], how="inner", on_merge="raise", **spec["interval"]))


if __name__ == "__main__":
    main(sys.argv[1])
