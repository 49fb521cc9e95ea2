"""The job file's `ring:` section: the PSP ring's size, rounds in flight, slice balancing,
relocation on a resize, standbys and crash recovery (ring mode)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from streamjoin.settings.base import StrictModel


class RingSpec(StrictModel):
    """PSP ring (the time-sliced join): N nodes each hold one time slice of every stream's window."""

    nodes: int | Literal["auto"] = Field(
        default="auto", description="ring size N at start; auto = the cost model's latency-minimising N")
    max_nodes: int = Field(default=8, ge=1, le=64,
                           description="the largest ring: the bound of nodes: auto's search and of `ring add`")
    max_rounds_in_flight: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = Field(
        default="auto",
        description="rounds in the ring at once: 1 = PSP (one round at a time), more = PSP-I interleaving; auto = "
                    "as many as keep every node busy (engine/psp/cost_model.py rounds_in_flight: 1 + (M-1) x N, "
                    "at most 16, following the ring's size)")
    slice_cap_tuples: int | None = Field(
        default=None, gt=0, description="workload smoothing: count bound on each non-tail node's slice per stream")
    relocation: Literal["passive", "aggressive"] = Field(
        default="passive", description="on a resize: slice bounds move gradually, or state moves at once")
    passive_rounds: int = Field(default=20, ge=1, description="rounds over which passive relocation moves bounds")
    round_ms: int = Field(default=100, gt=0, description="how often the head releases a round by watermark")
    head_weight: Annotated[float, Field(ge=0.0, le=1.0)] | Literal["auto"] = Field(
        default="auto",
        description="the head's slice of the window relative to another node's: the head also reads, sequences and "
                    "logs every tuple, so in a ring of several nodes an equal slice (1) makes it the slowest node; "
                    "0 = it keeps nothing past the round it releases; auto = what evens the loads for the ring's "
                    "size (engine/psp/cost_model.py balanced_head_weight: 0.82 at N=2, 0.64 at 4, 0.27 at 8)")
    standby_after_ms: int | None = Field(
        default=None, gt=0,
        description="a ring node silent this long is replaced by a standby (an alive worker outside the layout), "
                    "if there is one; until then the ring waits for it to restart. Unset: "
                    "coordinator.heartbeat_timeout_ms")
    recovery: bool = Field(
        default=True,
        description="crash recovery: the head logs every round before it enters the ring and the ring checkpoints "
                    "every checkpoint_ms; a restarted node rolls the ring back to the last checkpoint and the logged "
                    "rounds run again. false: no log, no checkpoints, and a restarted node stops the ring (fenced)")
    checkpoint_ms: int = Field(
        default=30_000, gt=0,
        description="how often the ring checkpoints (with recovery): the head stops releasing until the rounds in "
                    "flight are back, then a mark collects every node's slice ranges; what a rollback re-drives "
                    "is at most this much of rounds. Each checkpoint drains the ring, so a short interval costs "
                    "throughput on large windows (band, 15 minutes, N=1: 5 s cost 34%, 30 s 11%)")
