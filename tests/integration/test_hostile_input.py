"""Hostile input against real workers: 34 kinds of bad records interleaved with good
ones (a third of those pretty-printed, a third padded with whitespace), over 10,000 of them on a 2-way hash job with 2 workers, and on a 2-node ring. No
worker or head exits, each bad record is in the dead-letter topic exactly once with its
reason, the dead-letter metric agrees with the topic (hash), and the good records join
exactly."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections import Counter

import pytest

from streamjoin.launcher import wait_drained, wait_layout, wait_ring_quiet
from streamjoin.schemas.join_keys import key_bytes
from streamjoin.schemas.results import H_OFFSET, H_PARTITION, H_REASON, H_TOPIC, decode_headers
from streamjoin.services.io import kafka
from streamjoin.services.io.intake import STREAM_HEADER
from tests.integration.conftest import make_job
from tests.integration.kafka_harness import Row, check, produce, read_all
from tests.integration.ring_harness import check_ring, produce_rows
from tests.integration.test_ring import ring_fleet

pytestmark = pytest.mark.integration
MAX_RECORD_BYTES = 600_000


def _value(**change: object) -> bytes:
    return json.dumps({"k": 5, "ts": 20_000, "pad": "x"} | change).encode()


def _without(field: str) -> bytes:
    return json.dumps({k: v for k, v in {"k": 5, "ts": 20_000, "pad": "x"}.items() if k != field}).encode()


def hostile_records(now_ms: int) -> list[tuple[str, bytes | None, list | None, str]]:
    """(kind, value, headers, reason) of every kind of bad record the test writes."""
    good = _value()
    return [
        ("not JSON", b"{not json", None, "malformed"),
        ("int past int64", b'{"k": 1180591620717411303424, "ts": 20000, "pad": "x"}', None, "malformed"),
        ("float key", _value(k=1.5), None, "malformed"),
        ("float time", _value(ts=20_000.5), None, "malformed"),
        ("NaN time", b'{"k": 5, "ts": NaN, "pad": "x"}', None, "malformed"),
        ("Infinity time", b'{"k": 5, "ts": Infinity, "pad": "x"}', None, "malformed"),
        ("string key", _value(k="five"), None, "malformed"),
        ("number for string", _value(pad=7), None, "malformed"),
        ("deep nesting", b'{"k": ' + b"[" * 100_000 + b"]" * 100_000 + b', "ts": 20000, "pad": "x"}', None,
         "malformed"),
        ("huge array", _value(pad=list(range(50_000))), None, "malformed"),
        ("invalid UTF-8", b'{"k": 5, "ts": 20000, "pad": "\xff\xfe"}', None, "malformed"),
        ("lone surrogate", b'{"k": 5, "ts": 20000, "pad": "\\udc00"}', None, "malformed"),
        ("missing key", _without("k"), None, "malformed"),
        ("null key", _value(k=None), None, "malformed"),
        ("missing time", _without("ts"), None, "malformed"),
        ("null time", _value(ts=None), None, "malformed"),
        ("time past 2^60", _value(ts=1 << 61), None, "malformed"),
        ("empty", b"", None, "malformed"),
        ("tombstone", None, None, "malformed"),
        ("random bytes", bytes(range(256)) * 4, None, "malformed"),
        ("two objects on a line", good + b" " + good, None, "malformed"),
        ("carriage return", good + b"\r" + good, None, "malformed"),
        ("line break inside a string", b'{"k": 5, "ts": 20000, "pad": "x\ny"}', None, "malformed"),
        ("whitespace JSON does not allow", b"\x0c" + good, None, "malformed"),
        ("array", b"[1, 2, 3]", None, "malformed"),
        ("null", b"null", None, "malformed"),  # Arrow's JSON reader segfaults on input starting with null
        ("duplicate field", b'{"k": 5, "k": 6, "ts": 20000, "pad": "x"}', None, "malformed"),
        ("truncated", good[:-4], None, "malformed"),
        ("oversize", _value(pad="x" * (MAX_RECORD_BYTES + 1)), None, "oversize"),
        ("field past max_field_bytes", _value(pad="x" * 4097), None, "oversize"),
        ("str ending in U+0000", _value(pad="x\u0000"), None, "unsupported"),
        ("future", _value(ts=now_ms + 3_600_000), None, "future"),
        ("stream header not UTF-8", good, [(STREAM_HEADER, b"\xff\xfe")], "unknown-stream"),
        ("stream header None", good, [(STREAM_HEADER, None)], "unknown-stream"),
        ("stream header of another stream", good, [(STREAM_HEADER, b"q")], "unknown-stream"),
    ]


def spelled(n: int, doc: dict) -> str:
    """Valid JSON however it is spelled: every third good row pretty-printed, every third padded
    with whitespace inside and around (RFC 8259 allows both; they must join like the rest)."""
    if n % 3 == 1:
        return json.dumps(doc, indent=2)
    if n % 3 == 2:
        return " \t\r\n" + json.dumps(doc, separators=(" ,\n", " :\t")) + "\r\n "
    return json.dumps(doc)


def _write_hostile(job, bootstrap: str, kinds: list, copies: int = 1) -> dict[tuple[str, int, int], str]:  # type: ignore[no-untyped-def]
    """Each kind `copies` times on each stream's topic (the large kinds once: they are there to
    be large, not many); returns where each landed -> its reason."""
    producer = kafka.Cluster(bootstrap).producer()
    landed: dict[tuple[str, int, int], str] = {}

    def delivered(reason: str):  # type: ignore[no-untyped-def]
        def report(err, msg) -> None:  # type: ignore[no-untyped-def]
            assert err is None, err
            landed[(msg.topic(), msg.partition(), msg.offset())] = reason
        return report

    for s in job.streams:
        for _, value, headers, reason in kinds:
            for _ in range(1 if value is not None and len(value) > 10_000 else copies):
                producer.produce(job.topic_of(s), key=key_bytes(5), value=value, headers=headers,
                                 on_delivery=delivered(reason))
                producer.poll(0)
    assert producer.flush(30) == 0
    return landed


def _dead_letter_metric(port: int) -> Counter:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return Counter({m[1]: int(float(m[2])) for m in
                    re.finditer(r'^streamjoin_dead_letter_total\{reason="([^"]+)"\} (\S+)$', text, re.M)})


def test_hostile_records_are_dead_lettered_once_and_no_worker_stops(broker, fleet_for, tmp_path) -> None:
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 400}, {"range_ms": 250}], workers=2, partitions=8,
                   worker={"max_record_bytes": MAX_RECORD_BYTES})
    fleet = fleet_for(job, 2)
    kinds = hostile_records(int(time.time() * 1000))
    assert len(kinds) >= 25
    rows = [Row("rs"[i % 2], (i // 2) % 40, 10_000 + i * 5) for i in range(3000)]
    landed: dict[tuple[str, int, int], str] = {}
    for part in range(3):  # good, hostile, good, hostile, ...: the bad records share polls with good ones
        produce(job, broker.bootstrap, rows[part * 1000:(part + 1) * 1000], spelling=spelled)
        landed |= _write_hostile(job, broker.bootstrap, kinds, copies=60)
    assert len(landed) >= 10_000
    wait_drained(job, broker.bootstrap, fleet, timeout=300)

    assert _dead_letters(job, broker.bootstrap) == Counter({(ref, reason): 1 for ref, reason in landed.items()})
    fleet.assert_running()
    assert fleet.restarts == 0
    metric = sum((_dead_letter_metric(port) for port in fleet.metrics_ports.values()), Counter())
    assert metric == Counter(landed.values())
    result = check(job, broker.bootstrap)
    assert result.exact, result
    assert result.expected > 1000


def test_hostile_records_do_not_stop_a_ring(broker, tmp_path) -> None:
    """The same kinds, as many records, on both sources of a 2-node ring (equality as a band of width 0)."""
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 400}, {"range_ms": 250}], workers=2, partitions=4,
                   worker={"max_record_bytes": MAX_RECORD_BYTES},
                   join={"mode": "ring", "predicate": [{"left": "r.k", "right": "s.k", "within": 0}]},
                   ring={"nodes": 2})
    fleet = ring_fleet(job, broker.bootstrap, tmp_path, ["w0", "w1"])
    try:
        wait_layout(job, broker.bootstrap, fleet, ["w0", "w1"])
        kinds = hostile_records(int(time.time() * 1000))
        rows = [(i % 2, {"k": (i // 2) % 40, "ts": 10_000 + i * 5, "pad": "x"}) for i in range(3000)]
        landed: dict[tuple[str, int, int], str] = {}
        for part in range(3):
            produce_rows(job, broker.bootstrap, rows[part * 1000:(part + 1) * 1000], spelling=spelled)
            landed |= _write_hostile(job, broker.bootstrap, kinds, copies=60)
        assert len(landed) >= 10_000
        wait_ring_quiet(job, broker.bootstrap, fleet)
        fleet.assert_running()  # restart_workers is off: a node that exited fails here
        result = check_ring(job, broker.bootstrap)
        dead = _dead_letters(job, broker.bootstrap)
    finally:
        fleet.stop_all()
    assert dead == Counter({(ref, reason): 1 for ref, reason in landed.items()})
    assert result.exact, result
    assert result.expected > 1000


def _dead_letters(job, bootstrap: str) -> Counter:  # type: ignore[no-untyped-def]
    """((input topic, partition, offset), reason) -> how often the dead-letter topic holds it."""
    dead: Counter = Counter()
    for m in read_all(bootstrap, job.dead_letter_topic, job.partitions, "check-hostile"):
        h = decode_headers(m.headers())
        dead[((h[H_TOPIC], int(h[H_PARTITION]), int(h[H_OFFSET])), h[H_REASON])] += 1
    return dead
