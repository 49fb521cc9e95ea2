"""The sections for development and testing, not production: `workload:` (the generated
workloads the demo, the benchmarks and the tests feed a job with) and `faults:` (the protocol
steps crash tests make a process kill itself at; empty in production)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from streamjoin.settings.base import StrictModel

# airline workload: the real carrier codes and cities services/workloads.py draws from.
AIRLINE_MAX_CARRIERS = 20
AIRLINE_MAX_CITIES = 40

# The protocol steps a process can be made to crash at (FaultSpec), each between two durable
# actions of the migration protocol (the spill and memory balancing paper's;
# services/coordinator/moves.py says which), or of the SplitJoin merger's transaction
# (services/splitjoin/merger.py). A process named like a key here has that key's steps; any
# other name is a worker id.
CRASH_STEPS = {
    "coordinator": ("move-stored", "release-stored", "failover-stored"),
    "merger": ("merger-written",),
    "worker": ("sender-committed", "receiver-fenced", "receiver-restored", "receiver-recovered", "spill-written",
               "core-output-written", "core-checkpointed"),  # the last two: a SplitJoin core's release transaction
}


class FaultSpec(StrictModel):
    """Fault injection for crash tests and drills: each entry 'PROCESS:STEP' makes the named
    process (`coordinator`, `merger`, or a worker id) kill itself with SIGKILL the first time it reaches
    STEP; a marker file under `<worker.state_dir>/faults/` records the crash, so the restarted
    process goes on. Empty (the default) in production."""

    crash_at: list[str] = Field(
        default_factory=list,
        description="'coordinator:STEP', 'merger:STEP' or 'WORKER_ID:STEP'; coordinator steps: "
                    f"{', '.join(CRASH_STEPS['coordinator'])}; merger steps: {', '.join(CRASH_STEPS['merger'])}; "
                    f"worker steps: {', '.join(CRASH_STEPS['worker'])}")

    @field_validator("crash_at")
    @classmethod
    def _known_steps(cls, v: list[str]) -> list[str]:
        for entry in v:
            process, _, step = entry.partition(":")
            steps = CRASH_STEPS.get(process, CRASH_STEPS["worker"])
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", process) or step not in steps:
                raise ValueError(f"{entry!r} is not PROCESS:STEP with a step of {process or 'the process'} "
                                 f"({', '.join(steps)})")
        return v


class WorkloadSpec(StrictModel):
    """Generated workloads, all with Poisson arrivals:
    equijoin  the hash-partitioned cluster join paper's equi-join: b-model keys over
              `domain`, `tuple_bytes`-sized JSON tuples;
    band      the handshake/SplitJoin band join: numbers uniform in 1..`value_max`;
    images    the PSP ring paper's image join: RGB images of `pixels` pixels (Arrow
              blocks), drawn from round(1 / `selectivity`) scenes, so that share of
              pairs is similar;
    productivity the spill and memory balancing paper's partition groups of different
              productivity: each stream's one join key lands uniformly in the
              `partitions` groups, and group g gets
              join ratio j = join_ratios[g % len(join_ratios)]: within one range of
              `tuple_range` tuples (tuple_range / rate seconds) a tuple meets about j
              same-key tuples of each other stream (j^2 results in a 3-way join).
              Groups start on worker g % workers, so with 3 workers [4, 1, 1] makes
              worker 0's groups the productive ones (Figure 21), [4, 2, 1] thirds of
              the groups (Figure 11).
    zipf      hot keys: Zipf keys over `domain` (exponent `zipf_exponent`), key 0 the most
              frequent, plus key 0 for `top_key_share` of the tuples on top, `tuple_bytes`-sized
              JSON tuples like equijoin's;
    airline   the StreamReuse paper's Delta OIS example: streams flights, checkins,
              baggage and weather over one flight catalogue of `carriers` carriers (Zipf shares,
              exponent `carrier_skew`: a few big ones), about `flights_per_carrier`
              flights each, `terminals` terminals and `cities` destinations; each
              stream's rate is `rate` times its `rate_factors` entry."""

    kind: Literal["equijoin", "band", "images", "productivity", "zipf", "airline"] = Field(
        default="equijoin",
        description="the generator: equijoin (b-model keys over domain), band (numbers in 1..value_max), images "
                    "(RGB images), productivity (groups of different join ratios), zipf (Zipf keys over domain and "
                    "one hot key) or airline (flights, check-ins, baggage and weather over one flight catalogue)")
    rate: float = Field(default=1500.0, gt=0, description="tuples/s per stream")
    skew: float = Field(default=0.7, ge=0.5, lt=1.0, description="b-model bias")
    domain: int = Field(default=1 << 20, gt=1, description="join-key domain size (power of two)")
    zipf_exponent: float = Field(
        default=1.0, ge=0, le=4,
        description="zipf: the keys' Zipf exponent: key i (0-based) is drawn with weight 1 / (i + 1)^zipf_exponent "
                    "(0 = uniform over domain)")
    top_key_share: float = Field(
        default=0.0, ge=0, lt=1,
        description="zipf: this share of each stream's tuples take key 0 outright, the rest draw Zipf keys (so key 0 "
                    "carries at least this share: a single hot key)")
    tuple_bytes: int = Field(default=64, ge=32,
                             description="about how long each generated JSON record is, in bytes (a string "
                                         "field is padded to it)")
    seconds: float = Field(default=30.0, gt=0, description="how long `streamjoin sources` writes, in seconds")
    random_state: int = Field(default=7, description="the random state the generator starts from: the same value "
                                             "writes the same workload")
    value_max: int = Field(default=10_000, gt=0, description="band: values uniform in 1..value_max")
    pixels: int = Field(default=10_000, gt=0, description="images: pixels per image (3 bytes each)")
    selectivity: float = Field(default=0.1, gt=0, le=1, description="images: share of image pairs that match")
    tuple_range: int = Field(default=30_000, gt=0,
                             description="productivity: distinct join values per range of tuples, over all groups")
    join_ratios: list[float] = Field(default_factory=lambda: [4.0, 2.0, 1.0], min_length=1,
                                     description="productivity: group g's join ratio is join_ratios[g % len]")
    carriers: int = Field(default=12, ge=1, le=AIRLINE_MAX_CARRIERS, description="airline: carriers in the catalogue")
    carrier_skew: float = Field(default=1.0, ge=0, le=4,
                                description="airline: Zipf exponent of the carriers' shares of flights (0 = even)")
    flights_per_carrier: int = Field(default=40, ge=1, le=10_000,
                                     description="airline: mean flights per carrier (a carrier's share sets its own)")
    terminals: int = Field(default=5, ge=1, le=26, description="airline: terminals A, B, ... the gates lie in")
    cities: int = Field(default=30, ge=1, le=AIRLINE_MAX_CITIES, description="airline: destination (weather) cities")
    rate_factors: dict[str, float] = Field(
        default_factory=dict,
        description="stream name -> multiple of `rate` that stream is generated at (default 1): streams of one "
                    "workload need not share a rate (airline: weather reports are rarer than check-ins)")

    @field_validator("domain")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"domain must be a power of two for the b-model, e.g. {1 << v.bit_length()}")
        return v

    @field_validator("rate_factors")
    @classmethod
    def _finite_factors(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {name: f for name, f in v.items() if not 0 < f < float("inf")}
        if bad:
            raise ValueError(f"rate factors are positive finite multiples of workload.rate, got {bad}")
        return v

    @field_validator("join_ratios")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        # NaN fails both comparisons; infinity would size a group's key domain to nothing.
        bad = [r for r in v if not 0 < r < float("inf")]
        if bad:
            raise ValueError(f"join ratios are positive finite numbers (a group's same-key partners per stream per "
                             f"range), got {bad}")
        return v
