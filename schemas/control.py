"""Control-plane messages on `<job>.control` (one partition, JSON values,
key = message kind/worker) and the durable placement on `<job>.placement`
(compacted, key = group). Pydantic models; a value that is not one of them
decodes to None and is skipped."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, Field, ValidationError


class HotKey(BaseModel):
    """A join key a hash worker counted at or above coordinator.hot_key_cool_share of its input."""

    group: int
    key: str  # the key's canonical text (schemas/join_keys.py)
    count: int  # tuples of it counted (a Misra-Gries estimate: never above the true count)
    code: int | None = None  # the key as the engine holds it (its KEY column: the value, or a hash)


SplitPhase = Literal["split", "merging", "ended"]


class HotSplit(BaseModel):
    """A hot key split over slots (docs/modes/hash.md, splitting a hot key): stored by the
    coordinator on the placement topic (key `split/<episode>`), sent to the owner of `group`
    with its assignment, and recorded in the commit of the batch of `group` that applied it,
    so a replay applies it at the same batch. `merging`: the key cooled; the group stops
    spreading it and ends the episode once its slots can hold no partner of a later tuple."""

    episode: int = Field(ge=1)
    group: int = Field(ge=0)
    key: str
    code: int
    slots: list[int]
    merging: bool = False


class Heartbeat(BaseModel):
    type: Literal["heartbeat"] = "heartbeat"
    worker: str
    wall_ms: int
    groups: list[int] = Field(default_factory=list)
    lag: int = 0
    state_bytes: int = 0
    state_tuples: int = 0
    # Observations for the adaptive coordinator (services/coordinator/adapt.py); the defaults let
    # heartbeats of older workers decode. backlog_bytes: records fetched but not joined yet, plus
    # the consumer lag priced at the mean record size (the hash join's buffer occupancy, in bytes).
    # group_bytes: window state bytes of each owned group (the memory balancer's signal).
    backlog_bytes: int = 0
    group_bytes: dict[int, int] = Field(default_factory=dict)
    metrics_url: str = ""
    ring_layout: list[str] = Field(default_factory=list)  # ring head: the layout its rounds run on
    ring_busy: bool = False  # ring head: released tuples are still travelling the ring
    ring_round: int = 0
    ring_failed: str = ""  # ring node: why the ring stopped producing results ("" while it runs)
    # ring node: its epoch, its rollbacks, and at the head the rounds it re-drove and the last
    # rollback's seconds until every re-driven round was back (services/ring/node.py)
    ring_recovery: dict[str, float] = Field(default_factory=dict)
    epoch: int = 0  # hash worker: the placement epoch of the newest assignment it applied
    # Spill (docs/modes/hash.md, windows larger than memory; worker.spill). memory_bytes: window bytes held in memory;
    # memory_budget: worker.memory_bytes; spilled_bytes: window bytes on disk only (pushed groups,
    # and in deferred mode their generations); generations: spilled generations not cleaned up
    # yet; cleanup_backlog_bytes: their bytes; spilled_groups: groups with such generations
    # (lazy-disk never moves them); results_total: results produced since the worker started
    # (the coordinator's output-rate signal); pushes: pushes since the worker started;
    # group_results: results each owned group produced since the worker took it (P_o: lazy-disk
    # and active-disk move the productive groups).
    memory_bytes: int = 0
    memory_budget: int = 0
    spilled_bytes: int = 0
    generations: int = 0
    cleanup_backlog_bytes: int = 0
    spilled_groups: list[int] = Field(default_factory=list)
    results_total: int = 0
    pushes: int = 0
    group_results: dict[int, int] = Field(default_factory=dict)
    # Hot keys (services/hash/hot_keys.py): input tuples counted over the current and the last
    # reorganisation epoch, and the keys at or above coordinator.hot_key_cool_share of them.
    keys_counted: int = 0
    hot_keys: list[HotKey] = Field(default_factory=list)
    # Split hot keys (services/hash/split.py): per episode of a group this worker holds, how far
    # the group has applied it, as its checkpoint says.
    splits: dict[int, SplitPhase] = Field(default_factory=dict)


class RingLayout(BaseModel):
    """Coordinator -> ring head: run on this ring (head first) with these join orders."""

    type: Literal["ring-layout"] = "ring-layout"
    layout: list[str]
    orders: list[list[int]]
    epoch: int


# Exit status of a ring node that finds it was started before in this job while `ring.recovery`
# is off: its slices are gone, so it reports RingFailed and does not join. A supervisor
# restarting it gets the same answer (streamjoin.launcher.Fleet leaves it down).
RING_FENCED_EXIT = 79


class RingFailed(BaseModel):
    """Ring node -> everyone: the ring stops producing results (`reason`: node-restarted,
    stale-epoch, delivery). Results written before it are exact; none are written after."""

    type: Literal["ring-failed"] = "ring-failed"
    worker: str
    reason: str
    detail: str = ""
    wall_ms: int = 0


class RingChange(BaseModel):
    """Operator -> coordinator: add a worker to the ring, or take one out."""

    type: Literal["ring-change"] = "ring-change"
    action: Literal["add", "remove"]
    worker: str


class MoveGroup(BaseModel):
    """Operator -> coordinator: move partition group `group` to worker `to` (`streamjoin move`)."""

    type: Literal["move-group"] = "move-group"
    group: int
    to: str


class DrainWorker(BaseModel):
    """Operator -> coordinator: move every group off `worker` and give it none (`streamjoin drain`)."""

    type: Literal["drain-worker"] = "drain-worker"
    worker: str


class PushGroups(BaseModel):
    """Coordinator -> worker (active-disk spill): push at least `bytes` of in-memory window
    state to disk now, least productive groups first. `why`: the coordinator's reason, logged."""

    type: Literal["push-groups"] = "push-groups"
    worker: str
    bytes: int = Field(ge=0)
    why: str = ""


class Assignment(BaseModel):
    type: Literal["assignment"] = "assignment"
    worker: str
    groups: list[int]
    epoch: int
    # Workers declared dead that held some of `groups` last: before recovering those groups the
    # receiver fences their transactions, so a dead worker that was only paused (a zombie)
    # can commit nothing more.
    fence: list[str] = Field(default_factory=list)
    # The split hot keys of `groups` (applied at each group's next batch; services/hash/split.py).
    splits: list[HotSplit] = Field(default_factory=list)


FIRST_EPOCH = 1  # the placement epoch of a job's first placement; every move makes a newer one


class Placement(BaseModel):
    """One group's owner; the compacted topic's latest value per group is the placement."""

    group: int
    worker: str
    epoch: int
    # While set, the group is on its way from this worker to `worker`: the sender is told to
    # let go of it and the receiver is not given it until the sender has (a heartbeat at
    # this epoch or later without it), or the sender is dead.
    moving_from: str | None = None
    # Set from a failover until the receiver holds the group: the workers declared dead that may
    # have held it since it was last held for sure (a dead sender, a receiver that died on the
    # way), whose transactions the receiver fences first (a restarted coordinator must still
    # say so).
    dead_owners: list[str] = Field(default_factory=list)


ControlMessage = (Heartbeat | Assignment | RingLayout | RingChange | RingFailed | MoveGroup
                  | DrainWorker | PushGroups)
_KINDS: dict[str, type[BaseModel]] = {"heartbeat": Heartbeat, "assignment": Assignment, "ring-layout": RingLayout,
                                      "ring-change": RingChange, "ring-failed": RingFailed, "move-group": MoveGroup, "drain-worker": DrainWorker,
                                      "push-groups": PushGroups}


def encode(msg: BaseModel) -> bytes:
    return msg.model_dump_json().encode()


def decode_control(value: bytes) -> ControlMessage | None:
    try:
        data = json.loads(value)
    except ValueError:
        return None
    kind = data.get("type") if isinstance(data, dict) else None
    model = _KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        return None
    try:
        return model.model_validate(data)  # type: ignore[return-value]
    except ValidationError:
        return None  # a known kind with fields that do not fit: as unreadable as an unknown one
