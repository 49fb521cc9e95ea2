"""The nemesis: a job of any mode under a random fault schedule (numbered), fed live
with good, far-late and malformed records, checked exactly against the reference.

This module owns what every mode shares: the schedule, the live feeder, the fault loop and
the process faults, the dead-letter check, the long form and its table. Each mode's job,
faults and check live in a module of its own (MODES): nemesis_hash.py (hash mode, inner
and left joins), nemesis_splitjoin.py (SplitJoin cores and the merger), nemesis_queries.py
(continuous queries through the query service), nemesis_ring.py (a PSP ring with a
spare). A schedule is a list of faults at offsets into the run, drawn by
`schedule(seed, seconds, faults, kinds)` from the mode's own kinds.

The check: results exact against the reference (missing = extra = duplicate = 0), and
every malformed or far-late record in the dead-letter topic exactly once, with its reason.
The short seeded forms are tests/integration/test_nemesis.py; the long form
`python -m tests.integration.nemesis --schedules N --minutes M --modes ...` prints a table of
schedules survived per mode.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from confluent_kafka import Producer

from streamjoin.launcher import Fleet
from streamjoin.schemas.splitjoin import mark_of
from streamjoin.services import broker as embedded
from streamjoin.services.io import kafka
from streamjoin.settings import JobSettings
from tests.integration.kafka_harness import Check, read_all

# Every mode the long form knows: the module whose `run_one(mode, seed, seconds, faults, work, broker)` runs it.
MODES = {"hash-inner": "tests.integration.nemesis_hash", "hash-left": "tests.integration.nemesis_hash",
         "splitjoin": "tests.integration.nemesis_splitjoin",
         "queries": "tests.integration.nemesis_queries", "ring": "tests.integration.nemesis_ring"}
HEARTBEAT_TIMEOUT_MS, WORKER_TIMEOUT_MS = 2_000, 4_000
HOUR_MS = 3_600_000
MALFORMED = b'{"k": 1, "ts":'


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds into the run
    kind: str
    hold_s: float  # how long the process stays down, paused or replaced-by-nothing


def schedule(seed: int, seconds: float, faults: int, kinds: tuple[str, ...]) -> list[Fault]:
    """`faults` faults of `kinds` drawn from `seed`, spread over the first 80% of a `seconds`-long run."""
    rnd = random.Random(seed)
    times = sorted(rnd.uniform(2.0, max(2.5, 0.8 * seconds)) for _ in range(faults))
    out = []
    for at in times:
        kind = rnd.choice(kinds)
        hold = {"pause": rnd.uniform(WORKER_TIMEOUT_MS / 1000 + 1, WORKER_TIMEOUT_MS / 1000 + 4),
                "broker": rnd.uniform(1.0, 4.0)}.get(kind, rnd.uniform(0.5, 4.0))
        out.append(Fault(round(at, 2), kind, round(hold, 2)))
    return out


# A stream's next record: (rnd, stream index, event time) -> (key, partition or None for the key's, value).
RowMaker = Callable[[random.Random, int, int], tuple[bytes | None, int | None, dict]]


@dataclass
class Input:
    """What the feeder wrote: counts by kind, and the delivery errors."""

    good: int = 0
    late: int = 0
    malformed: int = 0
    newest_ts: int = 0  # the newest event time of a good record
    errors: list[str] = field(default_factory=list)


class Feeder(threading.Thread):
    """Rows of every stream at `rate` per stream per second, event time the wall clock (`row`
    may set it back a little); once `armed`, every half second a malformed record and a record
    an hour behind now. Which records were which is read back from the topics afterwards
    (`bad_records`): a broker's delivery report may place a batch's records loosely.

    A record is far-late only once the job's watermark has moved: `arm_after_s` arms the
    feeder itself that long after it starts (every group has event time by then), None
    leaves it to the caller (who waits for what shows the watermark moved)."""

    def __init__(self, topics_: list[str], bootstrap: str, rate: int, seed: int, row: RowMaker,
                 arm_after_s: float | None = 3.0) -> None:
        super().__init__(daemon=True)
        self.topics, self.bootstrap, self.rate, self.row = topics_, bootstrap, rate, row
        self.rnd, self.arm_after_s = random.Random(seed), arm_after_s
        self.stop, self.armed, self.input = threading.Event(), threading.Event(), Input()

    def _report(self, kind: str):  # type: ignore[no-untyped-def]
        def delivered(err, _msg) -> None:  # type: ignore[no-untyped-def]
            if err is not None:
                self.input.errors.append(str(err))
            else:
                setattr(self.input, kind, getattr(self.input, kind) + 1)
        return delivered

    def _produce(self, producer: Producer, i: int, ts: int, kind: str, value: bytes | None = None) -> None:
        key, partition, doc = self.row(self.rnd, i, ts)
        if kind == "good":
            self.input.newest_ts = max(self.input.newest_ts, doc["ts"])
        extra = {} if partition is None else {"partition": partition}
        producer.produce(self.topics[i], value if value is not None else json.dumps(doc).encode(), key=key,
                         on_delivery=self._report(kind), **extra)

    def run(self) -> None:
        producer = kafka.Cluster(self.bootstrap).producer(**{"message.timeout.ms": 120_000})
        tick, began = 0, time.monotonic()
        while not self.stop.is_set():
            now = int(time.time() * 1000)
            for _ in range(max(1, self.rate // 10)):
                for i in range(len(self.topics)):
                    self._produce(producer, i, now, "good")
            if self.arm_after_s is not None and time.monotonic() - began > self.arm_after_s:
                self.armed.set()
            if self.armed.is_set() and tick % 5 == 0:
                self._produce(producer, self.rnd.randrange(len(self.topics)), now - HOUR_MS, "late")
                self._produce(producer, self.rnd.randrange(len(self.topics)), now, "malformed", MALFORMED)
            producer.poll(0)
            tick += 1
            time.sleep(0.1)
        if producer.flush(120) != 0:
            self.input.errors.append("records still undelivered after 120 s")

    def finish(self) -> None:
        """Stop writing, and wait until every record written is delivered (or given up on)."""
        self.stop.set()
        self.join(150)

    def problems(self, bad: dict[tuple[str, int, int], str]) -> str:
        """What went wrong writing the input: delivery errors, or bad records read back other
        than as many as were written (the check would not cover them all)."""
        found = self.input.errors[:3]
        kinds = Counter(bad.values())
        if (kinds["late"], kinds["malformed"]) != (self.input.late, self.input.malformed):
            found.append(f"bad records read back {dict(kinds)}, written late={self.input.late} "
                         f"malformed={self.input.malformed}")
        return "; ".join(found)


def bad_records(bootstrap: str, input_topics: list[str], late_below_ms: int) -> dict[tuple[str, int, int], str]:
    """Every malformed or far-late (event time below `late_below_ms`) record on the inputs, by
    ref, with the reason it must be dead-lettered for; marks (SplitJoin) are no records."""
    cluster, bad = kafka.Cluster(bootstrap), {}
    for topic in input_topics:
        partitions = len(cluster.admin().list_topics(topic, timeout=10).topics[topic].partitions)
        for m in read_all(bootstrap, topic, partitions, "nemesis-inputs"):
            if mark_of(m.headers()) is not None:
                continue
            ref = (topic, m.partition(), m.offset())
            try:
                doc = json.loads(m.value())
            except ValueError:
                bad[ref] = "malformed"
                continue
            if doc["ts"] < late_below_ms:
                bad[ref] = "late"
    return bad


@dataclass
class Outcome:
    mode: str
    seed: int
    faults: list[Fault]
    result: Check | None
    dead_letter_ok: bool
    error: str = ""
    recovered: int = 0  # log lines of the services saying they restored or replayed something (recovery_lines)
    ordered: bool | None = None  # SplitJoin: results in input order
    bad: int = 0  # malformed and far-late records written
    job: JobSettings | None = None
    bootstrap: str = ""

    @property
    def survived(self) -> bool:
        return (not self.error and self.result is not None and self.result.exact and self.dead_letter_ok
                and self.ordered is not False)

    def row(self) -> dict:
        """The long form's JSON line for this run."""
        r = self.result
        return {"mode": self.mode, "seed": self.seed, "faults": dict(Counter(f.kind for f in self.faults)),
                "schedule": [(f.at_s, f.kind, f.hold_s) for f in self.faults], "survived": self.survived,
                "results": r.results if r else None, "expected": r.expected if r else None,
                "missing": r.missing if r else None, "extra": r.extra if r else None,
                "duplicates": r.duplicates if r else None, "dead_letters_exact": self.dead_letter_ok,
                "bad_records": self.bad, "ordered": self.ordered, "recovered": self.recovered,
                "sample": getattr(r, "sample", None) if r else None, "error": self.error[:2000]}


def checked(mode: str, seed: int, plan: list[Fault], feeder: Feeder, job: JobSettings, bootstrap: str,
            began_ms: int, result: Check, recovered: int, **extra: object) -> Outcome:
    """The outcome of a run that finished: `result` (the mode's own check of its output), and
    every bad record the feeder wrote found in the job's dead-letter topic once."""
    bad = bad_records(bootstrap, feeder.topics, began_ms - HOUR_MS // 2)
    return Outcome(mode, seed, plan, result, dead_letters_exact(job, bootstrap, bad), feeder.problems(bad),
                   recovered, bad=len(bad), job=job, bootstrap=bootstrap, **extra)  # type: ignore[arg-type]


def failed(mode: str, seed: int, plan: list[Fault], error: Exception) -> Outcome:
    """The outcome of a run that ended in an error (the long form reports every schedule)."""
    return Outcome(mode, seed, plan, None, False, f"{type(error).__name__}: {error}")


class Nemesis:
    """Applies a schedule's faults from the calling thread: `apply` calls the method named
    after the fault's kind. The process faults every mode shares are here; a mode's own
    subclass names its victims and adds its own kinds."""

    def __init__(self, fleet: Fleet | None, broker: embedded.EmbeddedBroker, seed: int) -> None:
        self.fleet, self.embedded = fleet, broker
        self.rnd, self.next_id = random.Random(seed + 1), 100

    def apply(self, fault: Fault) -> None:
        getattr(self, fault.kind)(fault)

    def supervise(self) -> None:
        """Restart what exited on its own (a fenced zombie exits 75: it comes back, as Kubernetes would)."""
        if self.fleet is not None:
            self.fleet.supervise()

    def idle(self, seconds: float) -> None:
        """Wait `seconds`, supervising meanwhile."""
        end = time.monotonic() + seconds
        while True:
            self.supervise()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.2, left))

    def broker(self, fault: Fault) -> None:
        os.kill(self.embedded.process.pid, signal.SIGSTOP)
        time.sleep(fault.hold_s)
        os.kill(self.embedded.process.pid, signal.SIGCONT)

    def _down(self, name: str, hold_s: float, back: Callable[[], None]) -> None:
        """SIGKILL the fleet's `name`; `back()` starts what replaces it `hold_s` later."""
        assert self.fleet is not None
        self.fleet.kill(name)
        self.idle(hold_s)
        back()

    def _stopped(self, proc: subprocess.Popen, hold_s: float) -> None:
        """SIGSTOP `proc` for `hold_s`, then SIGCONT."""
        proc.send_signal(signal.SIGSTOP)
        self.idle(hold_s)
        proc.send_signal(signal.SIGCONT)

    def cli(self, *args: str) -> bool:
        """A `streamjoin` command against the fleet's job; whether it succeeded (under faults
        it may be refused or time out: the check is what the output holds either way)."""
        assert self.fleet is not None
        try:
            done = subprocess.run([sys.executable, "-m", "streamjoin.cli", *args, "--job", str(self.fleet.job_file),
                                   "--bootstrap", self.fleet.bootstrap], capture_output=True, timeout=60)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0


def drive(nemesis: Nemesis, plan: list[Fault], seconds: float) -> None:
    """Apply `plan` from now on, each fault at its offset, and keep the services up until
    `seconds` have passed."""
    began = time.monotonic()
    for fault in plan:
        nemesis.idle(fault.at_s - (time.monotonic() - began))
        nemesis.apply(fault)
    nemesis.idle(seconds - (time.monotonic() - began))


@contextmanager
def broker_for(work: Path, broker: embedded.EmbeddedBroker | None) -> Iterator[embedded.EmbeddedBroker]:
    """`broker` when given (a test's shared one), else a fresh one for this run."""
    if broker is not None:
        yield broker
        return
    with embedded.start(log_path=work / "broker.log") as fresh:
        yield fresh


def serving(port: int) -> bool:
    """Whether the service on metrics port `port` answers (it has started)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5):
            return True
    except OSError:
        return False


def recovery_lines(log_dir: Path, *events: tuple[str, ...]) -> int:
    """Lines of the logs under `log_dir` holding every piece of one of `events`: the crash path
    ran (logs outlive the processes that wrote them; a restarted process's metrics start at 0)."""
    return sum(any(all(piece in line for piece in event) for event in events)
               for log in log_dir.rglob("*.log") for line in log.read_text(errors="replace").splitlines())


def dead_letter_refs(job: JobSettings, bootstrap: str) -> Counter:
    """The job's dead-letter topic: how often each (input ref, reason) is there."""
    from streamjoin.schemas.results import H_OFFSET, H_PARTITION, H_REASON, H_TOPIC, decode_headers

    seen: Counter = Counter()
    for m in read_all(bootstrap, job.dead_letter_topic, job.partitions, "nemesis-dlq"):
        h = decode_headers(m.headers())
        seen[((h[H_TOPIC], int(h[H_PARTITION]), int(h[H_OFFSET])), h[H_REASON])] += 1
    return seen


def dead_letters_exact(job: JobSettings, bootstrap: str, bad: dict[tuple[str, int, int], str],
                       only: Callable[[tuple[str, int, int]], bool] = lambda _: True) -> bool:
    """Every bad record (those `only` keeps) in the job's dead-letter topic exactly once, with
    its reason, and nothing else there."""
    seen = dead_letter_refs(job, bootstrap)
    want = Counter({(ref, reason): 1 for ref, reason in bad.items() if only(ref)})
    if seen != want:
        print(job.job, "dead letters: unexpected", dict(seen - want), "missing", dict(want - seen), file=sys.stderr)
    return seen == want


def run_mode(mode: str, seed: int, seconds: float, faults: int, work: Path,
             broker: embedded.EmbeddedBroker | None = None, rate: int | None = None) -> Outcome:
    """One run of any mode in MODES (`rate`: tuples per stream per second, None: the mode's own)."""
    options = {} if rate is None else {"rate": rate}
    return importlib.import_module(MODES[mode]).run_one(mode, seed, seconds, faults, work, broker, **options)


def table(rows: list[dict], modes: list[str]) -> str:
    """The long form's table: per mode, schedules survived, faults, results checked, anything lost."""
    lines = ["| mode | schedules | survived | faults injected | results checked | missing / extra / duplicate "
             "| dead letters exact | bad records | in input order |", "|---|---|---|---|---|---|---|---|---|"]
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        total = lambda key: sum(r[key] or 0 for r in mine)  # noqa: E731
        ordered = [r["ordered"] for r in mine if r["ordered"] is not None]
        lines.append(f"| {mode} | {len(mine)} | {sum(r['survived'] for r in mine)} | "
                     f"{sum(sum(r['faults'].values()) for r in mine)} | {total('results'):,} | "
                     f"{total('missing')} / {total('extra')} / {total('duplicates')} | "
                     f"{sum(r['dead_letters_exact'] for r in mine)} of {len(mine)} | {total('bad_records'):,} | "
                     f"{f'{sum(ordered)} of {len(ordered)}' if ordered else '-'} |")
    kinds = {mode: dict(sum((Counter(r["faults"]) for r in rows if r["mode"] == mode), Counter())) for mode in modes}
    failed = [f"{r['mode']} seed {r['seed']}: {r['schedule']}" for r in rows if not r["survived"]]
    return "\n".join(lines + ["", "faults by kind: " + json.dumps(kinds), "not survived:", *failed])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=20)
    parser.add_argument("--first-schedule", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=0.5, help="each run's length")
    parser.add_argument("--faults", type=int, default=4)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--work", type=Path, help="keep each run's logs under this folder (default: a temporary one)")
    parser.add_argument("--rows", type=Path,
                        help="no runs: the table of the JSON lines in this file (a long form's stderr)")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if args.rows:
        rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.startswith("{")]
        print(table(rows, [m for m in modes if any(r["mode"] == m for r in rows)]))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="nemesis-") as tmp:
        for mode in modes:
            for seed in range(args.first_schedule, args.first_schedule + args.schedules):
                out = run_mode(mode, seed, args.minutes * 60, args.faults, (args.work or Path(tmp)) / f"{mode}-{seed}")
                rows.append(out.row())
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(table(rows, modes))


if __name__ == "__main__":
    main()
