"""`streamjoin bench WORKLOAD`: our figures and every peer's, measured in the
same run on the same input, their ratios, the workload's parameters and the
machine; our output is always checked exact, and a fast but wrong run
reports `exact: false` (the CLI then exits 1).

A workload is a module with `run(env, quick, plot_path) -> dict` returning
at least `exact`, `parameters`, `ours`, `peers` and `ratios`; it registers
here. The shared pieces it builds on: `env` (broker, Spark, progress),
`ours` (sweep and replay of a hash-partitioned job), `peers/` (Spark, raw
Kafka consumption, the reference join), `inputs` (the input as Arrow tables)
and `report` (machine, rates, ratios, JSON, curves).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from streamjoin.bench import adapt, band, equijoin, psp, report, reuse, splitjoin
from streamjoin.bench.env import BenchEnv, bench_env

Workload = Callable[[BenchEnv, bool, "Path | None"], dict]
WORKLOADS: dict[str, Workload] = {"equijoin": equijoin.run, "band": band.run, "psp": psp.run, "adapt": adapt.run,
                                  "splitjoin": splitjoin.run, "reuse": reuse.run}


def run_bench(workload: str, quick: bool = False, json_path: Path | None = None,
              plot_path: Path | None = None) -> dict:
    """Run one workload on a fresh embedded broker; returns (and writes to `json_path`) the report."""
    machine = report.machine_info()
    began = time.monotonic()
    with bench_env() as env:
        result = WORKLOADS[workload](env, quick, plot_path)
    machine["load_average_after"] = report.load_average()
    result = {**result, "machine": machine, "wall_seconds": round(time.monotonic() - began, 1)}
    if json_path is not None:
        report.write_json(json_path, result)
    return result
