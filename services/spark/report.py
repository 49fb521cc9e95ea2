"""`verify`'s report: its fields on the job's streams and inputs (counts,
dead letters, lost inputs, groups never processed), the fields that must all be
0 for the output to be the exact join, and the plot of production delays.
"""

from __future__ import annotations

from functools import reduce
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from streamjoin.schemas.results import PRODUCED_MS
from streamjoin.settings import JobSettings

# Report fields any of which, when not 0, means the output is not the exact join.
MUST_BE_ZERO = ("missing", "extra", "duplicates", "bad_records", "bad_ids", "lost")
# Results plotted at most; more are sampled down.
_PLOT_POINTS = 100_000


def plot_delays(delays: DataFrame, stats: dict, title: str, path: Path) -> None:
    """Draws each result's production delay against when it was produced, with the p50 and
    p99 of `stats` (percentiles) as lines, into the PNG `path`. matplotlib is imported here,
    not at the top: it is needed only for a plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = delays.count()
    sample = delays if n <= _PLOT_POINTS else delays.sample(fraction=_PLOT_POINTS / n, seed=1)
    pts = sample.toPandas()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    if len(pts):
        t0 = pts[PRODUCED_MS].min()
        ax.scatter((pts[PRODUCED_MS] - t0) / 1000, pts["delay"], s=2, alpha=0.4, label="result")
        for key, style in (("p50", "--"), ("p99", ":")):
            ax.axhline(stats[key], color="red", linestyle=style, label=f"{key} = {stats[key]:.0f} ms")
        ax.legend(loc="upper right")
    ax.set_xlabel("produced at (s since first result)")
    ax.set_ylabel("production delay (ms)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stream_info(job: JobSettings) -> list[dict]:
    """The report's `streams`: what verify took each stream to be."""
    return [{"name": s.name, "topic": job.topic_of(s), "format": s.format, "key_fields": s.key_fields,
             "time_field": s.time_field, "window": s.window.model_dump(exclude_none=True) if s.window else None} for s in job.streams]


def input_summary(names: list[str], decoded: list[DataFrame], dead_records: int) -> dict:
    """Input counts per stream, the dead-lettered ones by reason, and the lost ones
    (unparsable, yet never dead-lettered)."""
    counts = [d.agg(F.count(F.lit(1)).alias("n"),
                    F.count_if(F.col("reason").isNotNull()).alias("dead"),
                    F.count_if(~F.col("ok") & F.col("reason").isNull()).alias("lost")).first() for d in decoded]
    by_reason = (reduce(DataFrame.unionByName, [d.filter(F.col("reason").isNotNull()).select("reason")
                                                for d in decoded]).groupBy("reason").count().collect())
    per_stream = {n: int(c["n"]) for n, c in zip(names, counts)}
    return {
        "inputs": {"per_stream": per_stream, "total": sum(per_stream.values())},
        "dead_letter": {"count": sum(int(c["dead"]) for c in counts),
                        "by_reason": {r["reason"]: int(r["count"]) for r in by_reason},
                        "records": dead_records},
        "lost": sum(int(c["lost"]) for c in counts),
    }


def groups_without_results(accepted: list[DataFrame], watermarks: DataFrame) -> int:
    """Groups with input but not one batch commit: never processed. Count windows
    expect nothing of them (nothing is final there), so the report says so."""
    groups = reduce(DataFrame.unionByName, [a.select("group") for a in accepted]).distinct()
    return groups.join(watermarks, "group", "left_anti").count()
