"""Exactness of a band join benchmark run: the exact result pairs of the backlog's last
tuples by NumPy brute force, compared with the results topic (missing, extra, duplicate),
and the brute force itself checked against engine/reference.py on a slice."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from streamjoin.bench.band_workload import Backlog, window_tuples
from streamjoin.engine.reference import RefWindow, ThetaTuple, reference_theta_join
from streamjoin.schemas.result_decode import decode_results
from streamjoin.schemas.result_format import result_layout
from streamjoin.schemas.results import RoundRelease, decode_commit
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings


# ---------------------------------------------------------------- exactness


def cut_time(backlog: Backlog, k: int) -> int:
    """The event time from which on at least k tuples (of both streams) remain: they are checked."""
    every = np.concatenate([backlog.ts(0), backlog.ts(1)])
    return int(np.partition(every, len(every) - k)[len(every) - k])


def check_tail(cluster: kafka.Cluster, job: JobSettings, backlog: Backlog, k: int, finished: bool) -> dict:
    """Results of every tuple with ts >= the cut, recomputed by brute force, against the results topic."""
    if not finished:
        return {"exact": False, "why": "the backlog was not finished within the budget", "last_produced_s": None}
    cut = cut_time(backlog, k)
    results = results_since(cluster, job, cut)
    produced = results["produced_ms"]
    recent = results["event_time"] >= cut
    observed = np.stack([tuple_index(backlog.offsets[i], results[f"{s.name}.offset"][recent])
                         for i, s in enumerate(job.streams)], axis=1) if recent.any() else np.empty((0, 2), np.int64)
    return compare_tail(backlog, cut, observed) | {
        "last_produced_s": float(produced.max()) / 1000 if len(produced) else None}


def compare_tail(backlog: Backlog, cut: int, observed: np.ndarray) -> dict:
    """`observed`: (r index, s index) of every result read whose event time is >= `cut`, against
    the brute force's; missing, extra and duplicate results."""
    exp, obs = pair_keys(expected_pairs(backlog, cut)), pair_keys(observed)
    unique = np.unique(obs)
    missing = int(len(np.setdiff1d(exp, unique)))
    extra = int(len(np.setdiff1d(unique, exp)))
    duplicates = int(len(obs) - len(unique))
    triggers = int(sum((backlog.ts(i) >= cut).sum() for i in range(2)))
    return {"exact": missing == extra == duplicates == 0, "checked_triggers": triggers, "from_event_time": cut,
            "expected": int(len(exp)), "results": int(len(obs)), "missing": missing, "extra": extra,
            "duplicates": duplicates, "how": "NumPy brute force: every trigger against every tuple of the other "
            "stream before it in the global order and inside its window"}


def tuple_index(offsets: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Positions of engine offsets in a stream's backlog (-1 for an offset that is not there)."""
    at = np.minimum(np.searchsorted(offsets, wanted), len(offsets) - 1)
    return np.where(offsets[at] == wanted, at, -1)


def pair_keys(pairs: np.ndarray) -> np.ndarray:
    """(r index, s index) rows as one int64 each."""
    return pairs[:, 0].astype(np.int64) * (1 << 32) + pairs[:, 1].astype(np.int64)


def results_since(cluster: kafka.Cluster, job: JobSettings, cut: int, margin_rounds: int = 3) -> dict[str, np.ndarray]:
    """Results of the rounds that may hold triggers at or after `cut`, read from the end of each
    results partition backwards. A round releases the tuples below its watermark (its release
    record on the commits topic), so a result's event time lies in its round's span; nodes'
    results of adjacent rounds may interleave, so reading goes back to results older than the
    watermark `margin_rounds` rounds before the first round that matters."""
    releases = sorted((c.round, c.watermark) for c in _commits(cluster, job) if isinstance(c, RoundRelease))
    needed = [i for i, (_, wm) in enumerate(releases) if wm > cut]
    floor = releases[max(0, needed[0] - margin_rounds)][1] if needed else None
    topic, group = job.results_topic, f"{job.consumer_group}-bench-results"
    layout = result_layout(job)
    ends = kafka.end_offsets(cluster, [(topic, p) for p in range(job.partitions)], group)
    parts = []
    for p in range(job.partitions):
        back = 256
        while True:
            start = max(0, ends[(topic, p)] - back)
            values = [m.value() for m in kafka.read_partition(cluster, topic, p, start, group)]
            decoded = decode_results(layout, job.output.format, values).columns
            times = decoded["event_time"]
            if start == 0 or floor is None or (len(times) and times[0] < floor):
                break
            back *= 4
        parts.append(decoded)
    return {name: np.concatenate([d[name] for d in parts]) for name in parts[0]}


def _commits(cluster: kafka.Cluster, job: JobSettings) -> list:
    topic = job.commits_topic
    records = kafka.read_partitions(cluster, topic, dict.fromkeys(range(job.partitions), 0),
                                    f"{job.consumer_group}-bench-commits")
    return [decode_commit(m.value()) for m in records]


def expected_pairs(backlog: Backlog, cut: int, cells: int = 1 << 24) -> np.ndarray:
    """(r index, s index) of every result whose newest member has ts >= cut, by brute force:
    each such trigger against every tuple of the other stream before it in the global order
    (ts, stream, partition, offset) and inside its window, with the job's terms evaluated as
    the engine does (|float64(left) - float64(right)| <= within). The first term is evaluated
    on every pair, the rest on the pairs it lets through."""
    out = []
    for i in range(2):
        j = 1 - i
        mine, theirs = backlog.ts(i), backlog.ts(j)
        trig = np.flatnonzero(mine >= cut)
        if not len(trig):
            continue
        # Tuples of j before trigger t: ts < T, or ts == T when j's stream index is lower.
        hi = np.searchsorted(theirs, mine[trig], "right" if j < i else "left")
        lo = (np.searchsorted(theirs, mine[trig] - backlog.case.size, "right") if backlog.case.kind == "time"
              else np.maximum(hi - backlog.case.size, 0))
        step = max(1, cells // max(int(hi.max() - lo.min()), 1))
        terms = _terms(backlog, i, j)
        for a in range(0, len(trig), step):
            t, lo_t, hi_t = trig[a:a + step], lo[a:a + step], hi[a:a + step]
            cand = np.arange(int(lo_t.min()), int(hi_t.max()))
            rows, cols = np.nonzero(terms[0](t[:, None], cand[None, :]))
            keep = (cand[cols] >= lo_t[rows]) & (cand[cols] < hi_t[rows])
            for term in terms[1:]:
                keep &= term(t[rows], cand[cols])
            pair = np.stack([t[rows[keep]], cand[cols[keep]]], axis=1)
            out.append(pair if i == 0 else pair[:, ::-1])
    return np.concatenate(out) if out else np.empty((0, 2), np.int64)


@dataclass(frozen=True)
class _Band:
    """One band term between trigger stream i and candidate stream j, on tuple indexes (broadcasting)."""

    mine: np.ndarray  # stream i's field, float64
    theirs: np.ndarray  # stream j's field, float64
    within: float
    left_is_mine: bool

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        left, right = (self.mine[a], self.theirs[b]) if self.left_is_mine else (self.theirs[b], self.mine[a])
        return np.abs(left - right) <= self.within


def _terms(backlog: Backlog, i: int, j: int) -> list[_Band]:
    names = [s.name for s in backlog.job.streams]
    out = []
    for term in backlog.job.join.predicate:
        (ls, lf), (_, rf) = term.left.split(".", 1), term.right.split(".", 1)
        left_is_mine = names.index(ls) == i
        mine_f, theirs_f = (lf, rf) if left_is_mine else (rf, lf)
        out.append(_Band(backlog.columns[i][mine_f].astype(np.float64), backlog.columns[j][theirs_f].astype(np.float64),
                         float(term.within), left_is_mine))
    return out


# ---------------------------------------------------------------- peers


def run_reference(backlog: Backlog, n: int) -> dict:
    """The floor: engine/reference.py's reference_theta_join (plain Python, every pair) on the
    first n tuples of each stream with the run's window; also checks this module's brute force
    against it on the same slice."""
    job, case = backlog.job, backlog.case
    cols = [{f: v[:n] for f, v in c.items()} for c in backlog.columns]
    small = dataclasses.replace(backlog, columns=cols, records=[], offsets=[])
    streams = [[ThetaTuple((job.topic_of(spec), 0, k), int(c[spec.time_field][k]),
                           {f: c[f][k].item() for f in spec.fields if f != spec.time_field})
                for k in range(len(c[spec.time_field]))] for spec, c in zip(job.streams, cols)]
    windows = [RefWindow(range_ms=case.size) if case.kind == "time" else RefWindow(rows=case.size)] * 2
    began = time.perf_counter()
    found = reference_theta_join(streams, windows, _reference_predicate(job))
    seconds = time.perf_counter() - began
    mine = {((job.topic_of(job.streams[0]), 0, int(a)), (job.topic_of(job.streams[1]), 0, int(b)))
            for a, b in expected_pairs(small, int(min(small.ts(0)[0], small.ts(1)[0])))}
    tuples = sum(len(s) for s in streams)
    pairs = len(streams[0]) * len(streams[1])
    per_window = window_tuples(case)
    return {
        "tuples_per_s": tuples / seconds, "pair_checks_per_s": pairs / seconds,
        "implied_tuples_per_s_at_full_window": pairs / seconds / per_window,
        "tuples": tuples, "results": len(found), "seconds": round(seconds, 3),
        "checker_agrees_with_reference": mine == found,
        "how": f"engine/reference.py reference_theta_join on the first {n} tuples of each stream of the "
               f"{case.name} backlog (all inside one window, so every r-s pair is checked); one process. A "
               "tuple at full window meets the other stream's whole window, so the implied rate is "
               f"pair checks/s / {per_window:,} (the window's tuples per stream)",
    }


def _reference_predicate(job: JobSettings):  # type: ignore[no-untyped-def]
    """The job's band terms as reference_theta_join's pair predicate (streams i < j)."""
    names = [s.name for s in job.streams]
    terms = [(names.index(t.left.split(".")[0]), t.left.split(".", 1)[1], names.index(t.right.split(".")[0]),
              t.right.split(".", 1)[1], float(t.within)) for t in job.join.predicate]

    def holds(i: int, a: ThetaTuple, j: int, b: ThetaTuple) -> bool:
        fields = {i: a.fields, j: b.fields}
        return all(abs(float(fields[ls][lf]) - float(fields[rs][rf])) <= w for ls, lf, rs, rf, w in terms
                   if {ls, rs} == {i, j})
    return holds
