"""The job file's `streams:` entries: each stream's fields and their types, its time and key
fields, its window (RANGE, ROWS, tumbling or hopping), its source filter and the size bounds of its records."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from streamjoin.settings.base import StrictModel

FieldType = Literal["int", "float", "str", "bool", "bytes"]
HASH_KEY_TYPES = ("int", "str", "bool")
# A hopping window holds every tuple once per instance it is in (hopping_ms / slide_ms, rounded up).
MAX_INSTANCES_PER_TUPLE = 1000
# Instance sizes and slides, in ms (about 34 years): instance arithmetic on epoch times stays far inside int64.
MAX_INSTANCE_MS = 1 << 40


class WindowSpec(StrictModel):
    """Exactly one kind: `range_ms` (time-based RANGE), `rows` (count-based ROWS, per key),
    `tumbling_ms` or `hopping_ms` with `slide_ms` (window instances: engine/window_instances.py)."""

    range_ms: int | None = Field(
        default=None, gt=0,
        description="a time (RANGE) window, in ms: a tuple is in its window at time T while T - its event time "
                    "< range_ms")
    rows: int | None = Field(
        default=None, gt=0,
        description="a count (ROWS) window, per key: a tuple is in its window while fewer than this many newer "
                    "tuples of its stream share its key")
    tumbling_ms: int | None = Field(
        default=None, gt=0, le=MAX_INSTANCE_MS,
        description="a tumbling window, in ms: instances [k * tumbling_ms, (k + 1) * tumbling_ms); a result is a "
                    "combination of tuples in one instance, emitted with its window_start and window_end. Every "
                    "stream of the job needs the same one (hash mode)")
    hopping_ms: int | None = Field(
        default=None, gt=0, le=MAX_INSTANCE_MS,
        description="a hopping window, in ms, with slide_ms: instances [k * slide_ms, k * slide_ms + hopping_ms); "
                    "a tuple is in about hopping_ms / slide_ms of them, and a combination is a result of each "
                    "instance holding all its members. Every stream of the job needs the same one (hash mode)")
    slide_ms: int | None = Field(
        default=None, gt=0, le=MAX_INSTANCE_MS,
        description="hopping windows only: how far each instance starts after the previous one, in ms "
                    f"(0 < slide_ms <= hopping_ms; equal to hopping_ms: tumbling). A tuple is held once per "
                    f"instance, so hopping_ms / slide_ms may be at most {MAX_INSTANCES_PER_TUPLE}")

    @model_validator(mode="after")
    def _one_kind(self) -> "WindowSpec":
        kinds = [k for k in ("range_ms", "rows", "tumbling_ms", "hopping_ms") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("give exactly one of range_ms (time window), rows (count window), tumbling_ms or "
                             f"hopping_ms with slide_ms (window instances), got {kinds or 'none'}")
        if (self.slide_ms is None) != (self.hopping_ms is None):
            raise ValueError("slide_ms goes with hopping_ms, and hopping_ms needs a slide_ms")
        size, slide = self.hopping_ms, self.slide_ms
        if size is None or slide is None:
            return self
        if slide > size:
            raise ValueError(f"slide_ms ({slide}) must not exceed hopping_ms ({size}): instances would leave gaps "
                             "no tuple belongs to")
        if -(-size // slide) > MAX_INSTANCES_PER_TUPLE:
            raise ValueError(f"slide_ms ({slide}) puts each tuple in more than {MAX_INSTANCES_PER_TUPLE} instances of "
                             f"hopping_ms ({size}); every tuple is held once per instance: give a slide of at least "
                             f"hopping_ms / {MAX_INSTANCES_PER_TUPLE}")
        return self

    @property
    def is_rows(self) -> bool:
        return self.rows is not None

    @property
    def instance(self) -> tuple[int, int] | None:
        """A tumbling or hopping window's (size, slide) in ms; None for RANGE and ROWS windows."""
        if self.tumbling_ms is not None:
            return self.tumbling_ms, self.tumbling_ms
        if self.hopping_ms is not None:
            return self.hopping_ms, self.slide_ms  # type: ignore[return-value]
        return None

    @property
    def span_ms(self) -> int | None:
        """How long after its event time a tuple can still join, in ms: the RANGE or the instance
        size (a copy alone in its instance is decided at ts + size); None for a count window."""
        return self.range_ms if self.range_ms is not None else self.tumbling_ms or self.hopping_ms


def _fits(field_type: FieldType, value: object) -> bool:
    """Whether a filter literal can equal a value of `field_type` (bool is not an int here)."""
    if isinstance(value, bool):
        return field_type == "bool"
    if isinstance(value, int):
        return field_type in ("int", "float")
    if isinstance(value, float):
        return field_type == "float"
    return field_type == "str" and isinstance(value, str)


class StreamSpec(StrictModel):
    name: str = Field(
        pattern=r"^[a-z][a-z0-9_]*$",
        description="the stream's name, as predicates, result records and workload.rate_factors call it")
    topic: str | None = Field(default=None, description="the Kafka topic the stream is read from (default "
                                                         "`<job>.<name>`)")
    format: Literal["json", "avro", "blocks"] = Field(
        default="json",
        description="how its records are encoded: json or avro (one tuple per record), or blocks (Arrow IPC, many "
                    "tuples per record)")
    fields: dict[str, FieldType] = Field(
        description="field name -> type (int, float, str, bool, bytes); a record with a field missing, null or "
                    "of another type is dead-lettered as malformed")
    time_field: str = Field(description="the int field that holds each tuple's event time, in epoch milliseconds")
    key_fields: list[str] = Field(default_factory=list, description="join key (hash mode needs one); Kafka record key")
    window: WindowSpec | None = Field(
        default=None,
        description="the stream's window: exactly one of range_ms (time), rows (count, per key), tumbling_ms, or "
                    "hopping_ms with slide_ms. Every stream of a window join needs one; the streams of an as-of "
                    "join (join.table) have none")
    where: dict[str, list[int | float | str | bool]] = Field(
        default_factory=dict,
        description="hash mode: a source filter, field -> allowed values (ANDed over fields); a tuple outside it "
                    "is skipped before the join (counted, not dead-lettered). The query service pushes its "
                    "operators' selection covers here (the StreamReuse paper's cascading relaxation, section 3.1)")
    max_field_bytes: int = Field(
        default=4096, gt=0, le=1 << 24,
        description="the longest str or bytes value a tuple may hold (UTF-8 bytes for str); a record with a "
                    "longer one is dead-lettered as oversize. A stream's values are held at the width of its "
                    "longest one, so this bounds what one record can add to the memory of a window")
    max_block_bytes: int = Field(
        default=64 << 20, gt=0, le=1 << 34,
        description="blocks format: the most bytes a record's Arrow IPC buffers may hold once decompressed "
                    "(LZ4/ZSTD bodies); a record that would expand past it is dead-lettered as oversize before "
                    "anything is decompressed")

    @model_validator(mode="after")
    def _fields_exist(self) -> "StreamSpec":
        if self.time_field not in self.fields:
            raise ValueError(f"time_field {self.time_field!r} is not one of fields {sorted(self.fields)}")
        if self.fields[self.time_field] != "int":
            raise ValueError(f"time_field {self.time_field!r} must be an int field (epoch milliseconds)")
        missing = [k for k in self.key_fields if k not in self.fields]
        if missing:
            raise ValueError(f"key_fields {missing} are not among fields {sorted(self.fields)}")
        unknown = [k for k in self.where if k not in self.fields]
        if unknown:
            raise ValueError(f"where names fields {unknown} that are not among fields {sorted(self.fields)}")
        empty = [k for k, values in self.where.items() if not values]
        if empty:
            raise ValueError(f"where lists no values for {empty}: the stream would never join")
        mistyped = [k for k, values in self.where.items() if not all(_fits(self.fields[k], v) for v in values)]
        if mistyped:
            raise ValueError(f"where values of {mistyped} do not fit their field types "
                             f"({ {k: self.fields[k] for k in mistyped} }); bytes fields cannot be filtered")
        return self
