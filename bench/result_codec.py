"""What writing results costs per result, format by format, beside its peers
measured in the same run: Arrow blocks (the cheapest the worker can write),
plain per-record Python (json.dumps, fastavro), and the producer call every
per-record format pays on top; and the vectorised partitioner beside Kafka's
scalar murmur2 in Python.

    python -m streamjoin.bench.result_codec [--rows 50000] [--repeats 5] [--json FILE]

Figures are medians over `repeats` runs of one block of the equijoin workload's shape (2
streams, int key, ts, 48-character pad each), in microseconds per result.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from pathlib import Path
from typing import Callable

import fastavro
import numpy as np
from confluent_kafka import Producer

from streamjoin.bench import report
from streamjoin.job_files import default_job_file
from streamjoin.engine.block import Block
from streamjoin.engine.result_ids import result_head
from streamjoin.schemas.columns import to_bytes_list
from streamjoin.schemas.join_keys import key_text
from streamjoin.schemas.result_decode import decode_results
from streamjoin.schemas.result_encode import (avro_values, encode_avro, encode_blocks, encode_json, json_documents,
                                              result_keys)
from streamjoin.schemas.result_format import ResultLayout, result_layout, results_avro_schema
from streamjoin.settings import load
from streamjoin.topology.partitioner import partition_for, partitions_for_keys

PAD_CHARS = 48
KEY_DOMAIN = 1 << 21


def equijoin_results(rows: int, seed: int = 0) -> tuple[ResultLayout, Block]:
    """The default job's layout and a result block of its shape: int key, ts and a 48-character
    pad per stream, ids from random refs, and the internal newest_arrival_ms column.

    rows: results in the block; seed: for the random values."""
    layout = result_layout(load(default_job_file()))
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 60, rows).astype(np.int32) for _ in layout.streams]
    offsets = [rng.integers(0, 1 << 30, rows) for _ in layout.streams]
    times = [1_700_000_000_000 + rng.integers(0, 60_000, rows) for _ in layout.streams]
    key = rng.integers(0, KEY_DOMAIN, rows)
    cols = result_head([s.topic for s in layout.streams], parts, offsets, np.max(times, axis=0), 1_700_000_100_000)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", "S1")
    for i, s in enumerate(layout.streams):
        pad = rng.choice(letters, (rows, PAD_CHARS)).view(f"S{PAD_CHARS}").ravel().astype(f"U{PAD_CHARS}")
        cols |= {f"{s.name}.partition": parts[i], f"{s.name}.offset": offsets[i], f"{s.name}.ts": times[i],
                 f"{s.name}.k": key, f"{s.name}.pad": pad}
    return layout, Block(cols | {"newest_arrival_ms": np.zeros(rows, np.int64)})


def _us_per_item(call: Callable[[], object], items: int, repeats: int) -> float:
    """Median microseconds per item of `call` over `repeats` runs, after one untimed run (first
    calls pay one-off set-up: pyarrow's first conversions take ~0.4 s)."""
    call()
    runs = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        runs.append(time.perf_counter() - began)
    return round(statistics.median(runs) / items * 1e6, 3)


def _python_json(layout: ResultLayout, block: Block) -> list[bytes]:
    """The per-record peer: each result's dict built in Python and json.dumps'd."""
    return [json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode() for record in
            _python_records(layout, block)]


def _python_avro(layout: ResultLayout, block: Block) -> list[bytes]:
    """The per-record peer: fastavro's schemaless writer, one record at a time."""
    schema = fastavro.parse_schema(results_avro_schema(layout))
    out = []
    for record in _python_records(layout, block):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, record)
        out.append(buf.getvalue())
    return out


def _python_records(layout: ResultLayout, block: Block) -> list[dict]:
    """Result records as dicts, row by row (for the peers only: the equijoin workload's layout, no blocks streams)."""
    columns = {name: block[name].tolist() for name in block.names}
    records = []
    for row in range(len(block)):
        record = {"result_id": f"{columns['result_id_hi'][row]:016x}{columns['result_id_lo'][row]:016x}",
                  "event_time": columns["event_time"][row], "produced_ms": columns["produced_ms"][row],
                  "inputs": {s.name: {"topic": s.topic, "partition": columns[f"{s.name}.partition"][row],
                                      "offset": columns[f"{s.name}.offset"][row]} for s in layout.streams}}
        for s in layout.streams:
            record[s.name] = {f: columns[f"{s.name}.{f}"][row] for f, _ in s.fields}
        records.append(record)
    return records


def _produce_call_us(values: list[bytes], keys: list[bytes], repeats: int) -> float:
    """What librdkafka's produce() costs per record in the calling thread: records queue locally
    (the bootstrap is unreachable), so this is the call alone, not the network."""
    producer = Producer({"bootstrap.servers": "127.0.0.1:9", "queue.buffering.max.messages": 10_000_000,
                         "queue.buffering.max.kbytes": 8 << 20, "linger.ms": 60_000, "log_level": 0})

    def produce_all() -> None:
        for key, value in zip(keys, values):
            producer.produce("results", value=value, key=key, partition=0)

    cost = _us_per_item(produce_all, len(values), repeats)
    producer.purge()
    return cost


def _formats(layout: ResultLayout, block: Block, repeats: int) -> dict:
    rows = len(block)
    out = {}
    for fmt, encode in (("json", lambda: encode_json(layout, block)), ("avro", lambda: encode_avro(layout, block)),
                        ("blocks", lambda: encode_blocks(block))):
        values = encode()
        out[fmt] = {"encode_us_per_result": _us_per_item(encode, rows, repeats),
                    "bytes_per_result": round(sum(map(len, values)) / rows, 1),
                    "decode_us_per_result": _us_per_item(lambda: decode_results(layout, fmt, values), rows, 1)}
    for fmt, assemble in (("json", lambda: json_documents(layout, block)),
                          ("avro", lambda: avro_values(layout, block))):
        arrow = assemble()
        out[fmt]["of_which_assembly_us"] = _us_per_item(assemble, rows, repeats)
        out[fmt]["of_which_to_bytes_us"] = _us_per_item(lambda: to_bytes_list(arrow), rows, repeats)
    return out


def _partitioner(rows: int, repeats: int) -> dict:
    keys = np.random.default_rng(1).integers(0, KEY_DOMAIN, rows)
    ours = _us_per_item(lambda: partitions_for_keys(key_text([(keys, "int")]), 60), rows, repeats)
    sample = keys[:20_000].tolist()  # the scalar peer is slow: a sample gives its rate
    peer = _us_per_item(lambda: [partition_for(str(k).encode(), 60) for k in sample], len(sample), 1)
    return {"int_keys": rows, "keys_per_s": round(1e6 / ours), "python_murmur2_keys_per_s": round(1e6 / peer),
            "ratio": report.ratio(round(1e6 / ours), round(1e6 / peer), "key text + murmur2 + partition", "keys/s")}


def measure(rows: int = 50_000, repeats: int = 5, key_rows: int = 200_000) -> dict:
    """The whole report: formats, their peers and ratios, keys, the producer call, the partitioner.

    rows: results per block; repeats: runs per figure (the median is kept); key_rows: int keys
    the partitioner hashes."""
    machine = report.machine_info()
    layout, block = equijoin_results(rows)
    formats = _formats(layout, block, repeats)
    peers = {"python_json_dumps_us_per_result": _us_per_item(lambda: _python_json(layout, block), rows, 1),
             "python_fastavro_us_per_result": _us_per_item(lambda: _python_avro(layout, block), rows, 1)}
    keys = result_keys(layout, block)
    keys_us = _us_per_item(lambda: partitions_for_keys(result_keys(layout, block), 60), rows, repeats)
    produce_us = _produce_call_us(encode_json(layout, block), to_bytes_list(keys), 1)
    blocks_us = formats["blocks"]["encode_us_per_result"]
    ratios = [report.ratio(formats[f]["encode_us_per_result"], blocks_us, f"{f} encode vs blocks", "us/result")
              for f in ("json", "avro")]
    ratios += [report.ratio(formats["json"]["encode_us_per_result"], peers["python_json_dumps_us_per_result"],
                            "json encode vs json.dumps per record", "us/result"),
               report.ratio(formats["avro"]["encode_us_per_result"], peers["python_fastavro_us_per_result"],
                            "avro encode vs fastavro per record", "us/result")]
    machine["load_average_after"] = report.load_average()
    return {"rows": rows, "repeats": repeats, "shape": "equijoin workload: 2 streams, int key, ts, 48-char pad each",
            "formats": formats, "peers": peers, "ratios": ratios,
            "result_keys_and_partitions_us_per_result": keys_us, "produce_call_us_per_record": produce_us,
            "partitioner": _partitioner(key_rows, repeats), "machine": machine}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    result = measure(args.rows, args.repeats)
    print(json.dumps(result, indent=2))
    if args.json is not None:
        report.write_json(args.json, result)


if __name__ == "__main__":
    main()
