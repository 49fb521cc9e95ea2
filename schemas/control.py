"""Control-plane messages on `<job>.control` (one partition, JSON values,
key = message kind/worker) and the durable placement on `<job>.placement`
(compacted, key = group). JSON Schema: schemas/files/control.schema.json."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, Field


class Heartbeat(BaseModel):
    type: Literal["heartbeat"] = "heartbeat"
    worker: str
    wall_ms: int
    groups: list[int] = Field(default_factory=list)
    lag: int = 0
    state_bytes: int = 0
    state_tuples: int = 0
    metrics_url: str = ""


class Assignment(BaseModel):
    type: Literal["assignment"] = "assignment"
    worker: str
    groups: list[int]
    epoch: int


class Placement(BaseModel):
    """One group's owner; the compacted topic's latest value per group is the placement."""

    group: int
    worker: str
    epoch: int


ControlMessage = Heartbeat | Assignment


def encode(msg: BaseModel) -> bytes:
    return msg.model_dump_json().encode()


def decode_control(value: bytes) -> ControlMessage | None:
    try:
        data = json.loads(value)
    except ValueError:
        return None
    kind = data.get("type") if isinstance(data, dict) else None
    if kind == "heartbeat":
        return Heartbeat.model_validate(data)
    if kind == "assignment":
        return Assignment.model_validate(data)
    return None
