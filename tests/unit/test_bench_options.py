"""`streamjoin bench` without Spark and with `--nodes`: workloads are imported only when
they run, so band and psp resolve where pyspark cannot be imported; `bench band --nodes`
parses a comma list of ring sizes into a scaling plan and reports each N against the smallest;
`--durability` pairs every run with one without ring recovery."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from streamjoin.bench import band, band_workload
from streamjoin.cli import app

runner = CliRunner()
SKEW_ONLY = "--workers and --headline are for `bench skew`"

NO_SPARK = textwrap.dedent("""
    import importlib.abc, sys

    class NoSpark(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "pyspark" or name.startswith("pyspark."):
                raise ImportError(f"{name} is blocked: this process has no Spark")
            return None

    sys.meta_path.insert(0, NoSpark())
    import streamjoin.bench as bench
    from streamjoin.cli import app

    for name in ("band", "psp"):
        assert callable(bench.workload(name)), name
    assert not any(m == "pyspark" or m.startswith("pyspark.") for m in sys.modules)
    print("resolved without pyspark")
""")


def test_band_and_psp_resolve_without_pyspark() -> None:
    done = subprocess.run([sys.executable, "-c", NO_SPARK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resolved without pyspark" in done.stdout


@pytest.mark.parametrize("text,sizes", [("1,2,4", (1, 2, 4)), (" 4, 1,2,2", (1, 2, 4)), ("3", (3,))])
def test_nodes_parse_to_distinct_ascending_sizes(text: str, sizes: tuple[int, ...]) -> None:
    assert band_workload.parse_nodes(text) == sizes


@pytest.mark.parametrize("text", ["", "0", "1,,2", "a", "1.5", "-1,2", "65", "1;2"])
def test_bad_nodes_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="--nodes"):
        band_workload.parse_nodes(text)


@pytest.mark.parametrize("plan", [band_workload.QUICK, band_workload.FULL])
def test_scaling_plan_runs_the_time_window_at_each_size(plan: band_workload.Plan) -> None:
    scaled = band_workload.scaling_plan(plan, (1, 2, 4))
    case = plan.runs[0][0]
    assert case.kind == "time"
    assert scaled.runs == ((case, 1), (case, 2), (case, 4))
    assert scaled.round_cap == plan.round_cap and scaled.budget_s == plan.budget_s


def test_durability_pairs_each_run_with_its_recovery_off_twin() -> None:
    def run(rate: float, recovery: bool) -> dict:
        return {"nodes": 2, "tuples_per_s": rate, "exact": True, "window": "time", "rate_per_stream": 1000.0,
                "recovery": recovery}

    cost = band.durability_cost([run(900.0, True)], [run(1000.0, False)])
    assert cost["runs"][0]["run"] == "time_r1000_n2"
    assert cost["runs"][0]["on_vs_off"]["ratio"] == 0.9


def test_scaling_reports_each_n_against_the_smallest() -> None:
    def run(n: int, rate: float | None) -> dict:
        return {"nodes": n, "tuples_per_s": rate, "sustainable": True, "exact": True, "window": "time",
                "window_size": 20_000, "rate_per_stream": 1000.0}

    curve = band.scaling([run(1, 2000.0), run(2, 3000.0), run(4, None)])
    assert curve["base_nodes"] == 1
    assert [p["vs_base"]["ratio"] for p in curve["curve"]] == [1.0, 1.5, None]
    assert curve["curve"][1]["vs_base"]["ours"] == 3000.0 and curve["curve"][1]["vs_base"]["peer"] == 2000.0


@pytest.mark.parametrize("args,words", [(["bench", "psp", "--nodes", "1,2"], "--nodes and --durability are for"),
                                        (["bench", "band", "--nodes", "0,2"], "1..64"),
                                        (["bench", "spill", "--nodes", "2"], "--nodes and --durability are for"),
                                        (["bench", "psp", "--durability"], "--nodes and --durability are for"),
                                        (["bench", "equijoin", "--workers", "3"], SKEW_ONLY),
                                        (["bench", "asof", "--headline"], SKEW_ONLY),
                                        (["bench", "skew", "--workers", "0"], "--workers must lie in 1..8"),
                                        (["bench", "skew", "--workers", "9"], "--workers must lie in 1..8")])
def test_bench_cli_rejects_bad_nodes_before_starting(args: list[str], words: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split())
