"""What a partition group's stored state reflects: the last batch applied,
its input boundary, the watermark, and where in the results and dead-letter
partitions the next batch's records begin (recovery reads from there)."""

from __future__ import annotations

from pydantic import BaseModel

from streamjoin.engine.window_join import NO_TIME


class GroupCheckpoint(BaseModel):
    seq: int = 0  # batches applied; batch numbers start at 1
    end: dict[str, int] = {}  # stream name -> next input offset in this group's partition
    max_ts: list[int] = []
    watermark: int = NO_TIME
    results_next: int = 0
    dead_letter_next: int = 0

    def encode(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> "GroupCheckpoint | None":
        return None if raw is None else cls.model_validate_json(raw)
