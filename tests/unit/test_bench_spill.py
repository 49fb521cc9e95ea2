"""`streamjoin bench spill --quick`, as a user runs it: the spill paper's four experiments on
in-process workers (no broker), each policy beside its counterpart on the same input; the JSON's
shape, every experiment exact (both runs' totals equal, every generation cleaned up), the PNGs,
and Figure 11's direction: pushing the most productive groups leaves more to the clean-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench


def test_bench_spill_quick_is_exact_and_pushing_the_productive_leaves_more_to_clean_up(tmp_path: Path) -> None:
    out, plot = tmp_path / "spill.json", tmp_path / "spill.png"
    done = subprocess.run([sys.executable, "-m", "streamjoin.cli", "bench", "spill", "--quick", "--json", str(out),
                           "--plot", str(plot)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-5000:]
    data = json.loads(out.read_text())
    assert json.loads(done.stdout) == data
    assert data["exact"] is True and data["parameters"]["mode"] == "quick"
    assert "no Kafka" in data["method"]
    assert set(data["experiments"]) == {"a", "b", "c", "d"}
    for name, e in data["experiments"].items():
        assert e["exact"] is True, name
        assert {"ours", "counterpart", "ratio", "paper"} <= set(e)
        assert e["ratio"]["ratio"] is not None
        for run in (e["ours"], e["counterpart"]):
            assert run["results"] == run["runtime_results"] + run["cleanup_results"] > 0
            assert run["pending_generations_after_flush"] == 0
            assert len(run["over_time"]["t_s"]) == len(run["over_time"]["runtime_results_per_s"]) > 1
        assert e["ours"]["results"] == e["counterpart"]["results"]
    a = data["experiments"]["a"]
    assert (a["ours"]["victims"], a["counterpart"]["victims"]) == ("productivity", "most-productive")
    assert a["counterpart"]["cleanup_results"] > a["ours"]["cleanup_results"]
    assert a["ours"]["pushes"] > 0 and a["counterpart"]["pushes"] > 0
    b = data["experiments"]["b"]
    assert b["ours"]["policy"] == "lazy-disk" and b["counterpart"]["policy"] == "none" and b["ours"]["moves"] > 0
    c = data["experiments"]["c"]
    assert c["goal"]["ratio_at_most"] == 0.25 and c["setup"]["memory_balance_theta"] == 0.9
    assert "theta_0_8" not in c  # the full run's comparison at the paper's example theta_d only
    assert data["experiments"]["d"]["ours"]["policy"] == "active-disk"
    assert sorted(Path(p).name for p in data["plots"]) == [f"spill-{x}.png" for x in "abcd"]
    assert all(Path(p).stat().st_size > 0 for p in data["plots"])
