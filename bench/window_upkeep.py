"""What one partition group's batch costs against the size of its window: the
window kept as tiered sorted runs (engine/runs.py) beside the peer it
replaced, measured in the same run: one block per stream, re-sorted whole
with every batch and filtered whole when tuples expire.

    python -m streamjoin.bench.window_upkeep [--sizes 10000 100000 1000000] [--batch 1000]
                                             [--repeats 7] [--json FILE]

A batch is engine.window_join.process_batch: sort the batch, probe, assemble
the results, insert, expire. The equijoin workload's tuple shape (2 streams, int key, ts,
a 48-character pad), one tuple per ms per stream, a RANGE window holding
`size` tuples of the two streams together; keys are uniform over as many
values as a stream's window holds, so each tuple meets about one partner at
every size and the results per batch stay the same. The window is filled by
one batch first; runs then need a window's worth of batches to reach their
steady tiers, so ours is timed over the second window's worth (the mean
includes the large merges that come once in a while), the peer over
`repeats` batches (its every batch costs the same).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from streamjoin.bench import report
from streamjoin.engine.block import KEY, TS, Block, concat, system_block
from streamjoin.engine.probe import expand_ranges, key_ranges, sort_by_key_time
from streamjoin.engine.window_join import GroupWindow, JoinPlan, StreamPlan, empty_window, process_batch

PAD_CHARS = 48
STREAMS = 2


class OneBlock:
    """The peer: a stream's window as it was kept before runs, one block sorted by (key, ts,
    off). It offers what GroupWindow asks of engine.runs.SortedRuns on the eager path.

    template: an empty block with the stream's columns."""

    def __init__(self, template: Block) -> None:
        self.template = template
        self.block = template

    def __len__(self) -> int:
        return len(self.block)

    def add(self, block: Block) -> None:
        """Concatenate and sort the whole window again."""
        if len(block):
            self.block = sort_by_key_time(concat([self.block, block]))

    def expire_before(self, floor: int) -> None:
        """Filter the whole window."""
        alive = self.block[TS] >= floor
        if not alive.all():
            self.block = self.block.filter(alive)

    def matching(self, keys: np.ndarray) -> Block:
        lo, hi = key_ranges(self.block[KEY], np.unique(keys))
        return self.block.take(expand_ranges(lo, hi)[1])


def _plan(range_ms: int) -> JoinPlan:
    streams = tuple(StreamPlan(name, f"bench.{name}", range_ms, None, ("pad",), ("k",)) for name in "rs")
    return JoinPlan(streams, lateness_ms=0, exact_keys=True)


def _stream_batch(rng: np.random.Generator, t0: int, n: int, domain: int) -> Block:
    """n tuples of one stream, one per ms from t0, keys uniform over `domain`."""
    ts = np.arange(t0, t0 + n, dtype=np.int64)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", "S1")
    pad = rng.choice(letters, (n, PAD_CHARS)).view(f"S{PAD_CHARS}").ravel().astype(f"U{PAD_CHARS}")
    return system_block(rng.integers(0, domain, n), ts, np.zeros(n), ts, ts, {"pad": pad})


class Feed:
    """Consecutive batches of both streams, each stream's times running on from the last batch."""

    def __init__(self, per_stream_window: int, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.domain = per_stream_window
        self.t = 0

    def next(self, per_stream: int) -> list[Block]:
        blocks = [_stream_batch(self.rng, self.t, per_stream, self.domain) for _ in range(STREAMS)]
        self.t += per_stream
        return blocks


def _timed_batches(plan: JoinPlan, window: GroupWindow, feed: Feed, per_stream: int, count: int) -> list[float]:
    """Milliseconds of each of `count` batches (the batch is made before the clock starts)."""
    out = []
    for _ in range(count):
        deltas = feed.next(per_stream)
        began = time.perf_counter()
        process_batch(plan, window, deltas, now_ms=0)
        out.append((time.perf_counter() - began) * 1e3)
    return out


def filled_window(size: int, peer: bool) -> tuple[JoinPlan, GroupWindow, Feed]:
    """A group whose window holds `size` tuples, in runs or (peer) one block per stream."""
    per_stream = size // STREAMS
    plan, feed = _plan(per_stream), Feed(per_stream)
    window = empty_window(plan, [b.take(np.empty(0, np.int64)) for b in feed.next(0)])
    if peer:
        window.runs = [OneBlock(r.template) for r in window.runs]  # type: ignore[misc]  # duck-typed
    process_batch(plan, window, feed.next(per_stream), now_ms=0)
    return plan, window, feed


def _summary(ms: list[float]) -> dict:
    return {"batches": len(ms), "median_ms": round(statistics.median(ms), 3), "mean_ms": round(statistics.mean(ms), 3),
            "max_ms": round(max(ms), 3)}


def measure_size(size: int, batch: int, repeats: int) -> dict:
    """Ours and the peer at one window size.

    size: tuples in the window (both streams); batch: tuples per batch (both streams);
    repeats: timed batches of the peer."""
    per_stream_batch = batch // STREAMS
    turnover = max(size // batch, 1)  # batches until every tuple of the window has been replaced
    plan, window, feed = filled_window(size, peer=False)
    _timed_batches(plan, window, feed, per_stream_batch, turnover)
    copied_before = sum(r.copied for r in window.runs)
    ours = _timed_batches(plan, window, feed, per_stream_batch, max(turnover, 50))
    copied = (sum(r.copied for r in window.runs) - copied_before) / len(ours)
    runs = [len(r.runs) for r in window.runs]
    plan, peer_window, feed = filled_window(size, peer=True)
    peer = _timed_batches(plan, peer_window, feed, per_stream_batch, repeats)
    return {"window_tuples": window.tuples, "batch_tuples": batch, "runs_per_stream": runs,
            "tuples_copied_per_batch": round(copied), "ours": _summary(ours), "peer_one_block": _summary(peer),
            "ratios": [report.ratio(_summary(ours)["median_ms"], _summary(peer)["median_ms"],
                                    "median batch, runs vs one block", "ms"),
                       report.ratio(_summary(ours)["mean_ms"], _summary(peer)["mean_ms"],
                                    "mean batch (merges included), runs vs one block", "ms")]}


def measure(sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000), batch: int = 1000, repeats: int = 7) -> dict:
    """The whole report: one entry per window size, and the machine.

    sizes: window sizes in tuples; batch: tuples per batch; repeats: timed batches of the peer."""
    machine = report.machine_info()
    results = [measure_size(size, batch, repeats) for size in sizes]
    machine["load_average_after"] = report.load_average()
    return {"shape": "equijoin workload: 2 streams, int key, ts, 48-char pad; uniform keys, ~1 partner per tuple",
            "sizes": results, "machine": machine}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    result = measure(tuple(args.sizes), args.batch, args.repeats)
    print(json.dumps(result, indent=2))
    if args.json is not None:
        report.write_json(args.json, result)


if __name__ == "__main__":
    main()
