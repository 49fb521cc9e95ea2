"""`streamjoin bench WORKLOAD`: our figures and every peer's, measured in the
same run on the same input, their ratios, the workload's parameters and the
machine; our output is always checked exact, and a fast but wrong run
reports `exact: false` (the CLI then exits 1).

A workload is a module with `run(env, quick, plot_path) -> dict` returning
at least `exact`, `parameters`, `ours`, `peers` and `ratios`; it registers
here by module name and is imported only when it runs, so a workload that
needs no Spark (band, psp's imports) runs where pyspark is not installed.
Options beyond --quick go to `run` as keywords (band: `nodes`; skew: `workers`). The shared
pieces it builds on: `env` (broker, Spark, progress), `ours` (sweep and
replay of a hash-partitioned job), `peers/` (Spark, raw Kafka consumption,
the reference join), `inputs` (the input as Arrow tables) and `report`
(machine, rates, ratios, JSON, curves).
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any, Callable

from streamjoin.bench import report
from streamjoin.bench.env import bench_env

Workload = Callable[..., dict]  # run(env: BenchEnv, quick: bool, plot_path: Path | None, **options) -> dict
WORKLOADS: dict[str, str] = {name: f"streamjoin.bench.{name}"
                             for name in ("equijoin", "band", "psp", "adapt", "delay", "splitjoin", "reuse", "asof",
                                          "nexmark", "skew", "window")}


def workload(name: str) -> Workload:
    """The `run` of workload `name` (a key of WORKLOADS), importing its module now."""
    return importlib.import_module(WORKLOADS[name]).run


def run_bench(workload_name: str, quick: bool = False, json_path: Path | None = None,
              plot_path: Path | None = None, runner: Workload | None = None, **options: Any) -> dict:
    """Run one workload on a fresh embedded broker; returns (and writes to `json_path`) the report.
    runner: the workload's `run` when it is not its module's (equijoin's scale-out curve);
    options: the workload's own keywords (band: nodes)."""
    run = runner or workload(workload_name)
    machine = report.machine_info()
    began = time.monotonic()
    with bench_env() as env:
        result = run(env, quick, plot_path, **options)
    machine["load_average_after"] = report.load_average()
    result = {**result, "machine": machine, "wall_seconds": round(time.monotonic() - began, 1)}
    if json_path is not None:
        report.write_json(json_path, result)
    return result
