"""The nemesis's short seeded forms (tests/integration/nemesis.py), one per mode, on one
broker: each runs a job fed live with far-late and malformed records under a fault schedule
drawn from a seed, and checks it exact against the reference with every bad record
dead-lettered once. NEMESIS_SCHEDULE picks another schedule for every mode; the long form
(`python -m tests.integration.nemesis`) runs many.

- hash mode, a left join on 3 workers: its seed (7) SIGKILLs a worker (back under its
  id), pauses the broker and replaces a worker by one with a new id;
- SplitJoin's cores and merger: its seed (38) SIGKILLs core 0 (the core that writes the
  dead letters; it restores from its own changelog) and then scales k live (a new core
  starts from core 0's snapshot); the results also leave the merger in input order;
- the query service: its seed (21) registers a query live (a new operator version, the
  queries switching to it at a barrier) and then SIGKILLs the service's pod (the service
  and its operator versions): it carries on from its registry, every query exact;
- ring mode, the 3-way band ring with a spare: its seed (55) adds the spare to the ring,
  SIGKILLs a node (back under its own id: every node rolls back, the head decides again
  what it read since its last logged round, dead-lettering none of it twice) and then
  removes a node other than the head, live.

SplitJoin and the ring are also checked by Spark `verify`, the independent oracle."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from streamjoin.services import broker as embedded
from tests.integration.kafka_harness import assert_spark_verified
from tests.integration.nemesis import Outcome, run_mode

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[embedded.EmbeddedBroker]:
    """One broker for the module's runs (each its own job and topics): a broker pause in one
    run is over before the next starts."""
    b = embedded.start(log_path=tmp_path_factory.mktemp("nemesis-broker") / "broker.log")
    yield b
    b.stop()


def seeded(default: int) -> int:
    return int(os.environ.get("NEMESIS_SCHEDULE", str(default)))


def assert_survived(out: Outcome, least_results: int, faults: int) -> None:
    assert not out.error, (out.error, out.faults)
    assert len(out.faults) == faults
    assert out.result is not None and out.result.expected > least_results, out
    assert out.result.exact, (out.result, out.faults)
    assert out.dead_letter_ok, out.faults
    assert out.bad > 10, out  # far-late and malformed records were written (and found dead-lettered above)


def assert_oracle_agrees(out: Outcome) -> None:
    assert out.job is not None and out.result is not None
    assert_spark_verified(out.job, out.bootstrap, out.result.expected)


def test_a_left_join_survives_a_seeded_fault_schedule(shared_broker: embedded.EmbeddedBroker, tmp_path: Path) -> None:
    out = run_mode("hash-left", seeded(7), seconds=16, faults=3, work=tmp_path, broker=shared_broker)
    assert_survived(out, 1000, 3)
    if {f.kind for f in out.faults} & {"kill", "replace", "pause"}:  # a worker's crash path ran
        assert out.recovered > 0, out.faults


@pytest.mark.spark
@pytest.mark.usefixtures("spark")  # `verify` runs on the session's one JVM, not a JVM of its own
def test_splitjoin_and_its_merger_survive_a_seeded_fault_schedule(shared_broker: embedded.EmbeddedBroker,
                                                                  tmp_path: Path) -> None:
    out = run_mode("splitjoin", seeded(38), seconds=12, faults=2, work=tmp_path, broker=shared_broker)
    assert_survived(out, 1000, 2)
    assert out.ordered, "results left the merger out of input order"
    if {f.kind for f in out.faults} & {"kill", "merger"}:  # a restarted core or merger restored its checkpoint
        assert out.recovered > 0, out.faults
    assert_oracle_agrees(out)


def test_continuous_queries_survive_a_seeded_fault_schedule(shared_broker: embedded.EmbeddedBroker,
                                                            tmp_path: Path) -> None:
    out = run_mode("queries", seeded(21), seconds=12, faults=2, work=tmp_path, broker=shared_broker)
    assert_survived(out, 1000, 2)
    if "service" in {f.kind for f in out.faults}:  # the restarted service carried on from its registry
        assert out.recovered > 0, out.faults


@pytest.mark.spark
@pytest.mark.usefixtures("spark")  # `verify` runs on the session's one JVM, not a JVM of its own
def test_a_ring_survives_a_seeded_fault_schedule(shared_broker: embedded.EmbeddedBroker, tmp_path: Path) -> None:
    out = run_mode("ring", seeded(55), seconds=12, faults=3, work=tmp_path, broker=shared_broker, rate=20)
    assert_survived(out, 1000, 3)
    if {f.kind for f in out.faults} & {"kill", "replace"}:  # the ring rolled back mid-run
        assert out.recovered > 0, out.faults
    assert_oracle_agrees(out)
