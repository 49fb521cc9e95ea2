"""The one writer of results (services/io/results.ResultWriter): a cycle's groups written
together are the records, keys and partitions that writing each group alone gives, each
partition's records in the same order, in every output format."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamjoin.engine.block import Block
from streamjoin.engine.result_ids import RESULT_ID_HI, RESULT_ID_LO
from streamjoin.schemas.result_format import result_layout
from streamjoin.services.io import results
from streamjoin.services.io.deliveries import Deliveries
from streamjoin.services.io.results import ResultSink, ResultWriter
from tests.unit.test_result_codec import FMTS, blocks, jobs
from tests.profiles import examples


class RecordingProducer:
    """What produce_batch was handed, per partition in order; every batch fits the queue."""

    def __init__(self) -> None:
        self.records: dict[int, list[tuple[bytes, bytes]]] = defaultdict(list)

    def produce_batch(self, topic: str, messages: list[dict], partition: int) -> int:
        self.records[partition] += [(m["key"], m["value"]) for m in messages]
        return len(messages)


def _written(job, write) -> tuple[int, dict[int, list[tuple[bytes, bytes]]]]:  # type: ignore[no-untyped-def]
    producer = RecordingProducer()
    writer = ResultWriter(ResultSink.of_job(job), producer, Deliveries(), every_report=False)  # type: ignore[arg-type]
    count = write(writer)
    return count, dict(producer.records)


@pytest.fixture(autouse=True)
def small_is_three(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of up to 6 rows, some encoded together (under 3) and some alone."""
    monkeypatch.setattr(results, "SMALL_RESULTS", 3)


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data(), fmt=st.sampled_from(FMTS))
def test_groups_written_together_are_each_group_written_alone(data: st.DataObject, fmt: str) -> None:
    job = data.draw(jobs(output=fmt))
    layout = result_layout(job)
    groups = data.draw(st.lists(st.integers(0, 59), unique=True, max_size=4))
    per_group: list[tuple[int, Block]] = [(g, data.draw(blocks(layout))) for g in groups]
    together = _written(job, lambda writer: writer.write_groups(per_group))
    alone = _written(job, lambda writer: sum(writer.write(block, group=g) for g, block in per_group))
    assert together == alone
    assert set(together[1]) == {g for g, block in per_group if len(block)}


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_query_sink_gets_each_result_keyed_by_its_id_at_the_partition_given(data: st.DataObject) -> None:
    """The query router's use: results decoded from records (no arrival column), one partition
    each chosen by the caller, JSON records keyed by the 32-hex result id."""
    job = data.draw(jobs(output="json"))
    layout = dataclasses.replace(result_layout(job), mode="query")
    drawn = data.draw(blocks(layout))
    block = Block({k: v for k, v in drawn.columns.items() if k != "newest_arrival_ms"})
    partitions = np.array(data.draw(st.lists(st.integers(0, 2), min_size=len(block), max_size=len(block))), np.int32)
    producer = RecordingProducer()
    writer = ResultWriter(ResultSink("q-1.sink", 3, layout, "json"), producer, Deliveries(), every_report=False)
    assert writer.write(block, partitions) == len(block)  # type: ignore[arg-type]
    ids = [f"{hi:016x}{lo:016x}".encode() for hi, lo in zip(block[RESULT_ID_HI].tolist(), block[RESULT_ID_LO].tolist())]
    for p in range(3):
        assert [key for key, _ in producer.records.get(p, [])] == [i for i, q in zip(ids, partitions) if q == p]
