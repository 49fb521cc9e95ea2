"""The job file's `join:` section: the join's type and mode, its predicate terms and UDFs
(ring and SplitJoin modes), and how input is read (lateness, idleness, read-ahead,
repartitioning, start offsets)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from streamjoin.settings.base import StrictModel


class PredicateTerm(StrictModel):
    """One condition between two streams' fields, each named "stream.field".

    No `within` and no `udf`: equality. `within: d`: abs(left - right) <= d
    (a band). `udf: name`: the mask returned by the UDF registered under
    `join.udfs[name]`, called with aligned NumPy arrays of the two fields and
    `args` as keyword arguments."""

    left: str = Field(pattern=r"^[a-z][a-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$",
                      description="one side of the term, as stream.field")
    right: str = Field(pattern=r"^[a-z][a-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$",
                       description="the other side, as stream.field of another stream")
    within: float | None = Field(
        default=None, ge=0,
        description="a band term: the two fields match when abs(left - right) <= within (unset, and no udf: "
                    "equality)")
    udf: str | None = Field(
        default=None,
        description="a UDF term: the name under join.udfs of a function that returns the mask of matching pairs, "
                    "given aligned NumPy arrays of the two fields")
    args: dict[str, Any] = Field(default_factory=dict,
                                 description="keyword arguments the UDF gets with every call")

    @model_validator(mode="after")
    def _one_kind(self) -> "PredicateTerm":
        if self.within is not None and self.udf is not None:
            raise ValueError("a term is a band (`within`) or a UDF (`udf`), not both")
        if self.left.split(".")[0] == self.right.split(".")[0]:
            raise ValueError(f"a term relates two different streams, got {self.left} and {self.right}")
        return self

    @property
    def kind(self) -> Literal["eq", "band", "udf"]:
        return "udf" if self.udf is not None else "band" if self.within is not None else "eq"


JoinType = Literal["inner", "left", "right", "full", "semi", "anti"]


class JoinSpec(StrictModel):
    type: JoinType = Field(
        default="inner",
        description="inner: combinations only; left/right/full: also each row of the first/second/both streams "
                    "that no partner joined, null-padded, once the watermark proves none can come; semi: each row of "
                    "the first stream once, on its first match; anti: each row of the first stream no partner "
                    "joined, once proven. Not inner: hash mode, two streams")
    mode: Literal["hash", "ring", "splitjoin"] = Field(
        default="hash", description="hash: partition groups by key; ring: PSP time slices; "
                                    "splitjoin: broadcast cores, results in input order")
    allowed_lateness_ms: int = Field(
        default=2000, ge=0,
        description="how far behind the newest event time a record may arrive and still join, in ms: the "
                    "watermark is the newest event time (the least over streams) minus this, and a record older "
                    "than the watermark is dead-lettered as late")
    idle_timeout_ms: int | None = Field(
        default=None, ge=0,
        description="an input (ring: source partition; hash: a group's stream) with no record for this long stops "
                    "holding the watermark back, so the others make progress; a record arriving on it later behind "
                    "the watermark is dead-lettered as late. None or 0: off (wait for every input, exact)")
    max_read_ahead_ms: int | None = Field(
        default=10_000, ge=0,
        description="hash mode: a group's stream whose newest event time is more than this ahead of its slowest "
                    "stream that still has records to read is paused until that one catches up (event-time "
                    "aligned intake, as Kafka Streams picks the partition with the lowest head), so a backlog "
                    "drain keeps the window at its size instead of buffering one stream whole. None: off")
    table: str | None = Field(
        default=None, pattern=r"^[a-z][a-z0-9_]*$",
        description="an as-of (temporal) join: the stream named here is a versioned table (each record the row of "
                    "its key as of its event time), and each tuple of the other stream joins the version of its key "
                    "valid at its time, once the table's watermark has passed it (type inner or left; hash mode, "
                    "two streams, no windows)")
    predicate: list[PredicateTerm] = Field(
        default_factory=list, description="ring mode: ANDed terms (equality, band, UDF); hash mode joins on keys")
    udfs: dict[str, str] = Field(default_factory=dict, description="UDF name -> 'module:callable'")
    order: dict[str, list[str]] = Field(
        default_factory=dict,
        description="ring mode: per arriving stream, the order in which it probes the others "
                    "(default: ascending rate x window x selectivity, the PSP paper's section 5.4)")
    repartition: Literal["auto", "never"] = Field(
        default="auto",
        description="hash mode: a record whose partition is not murmur2(join key) mod partitions is re-routed "
                    "through <job>.<stream>.by-key (auto) or dead-lettered as misrouted (never)")
    repartition_watermarks: bool = Field(
        default=False,
        description="hash mode, repartition auto: a group tells the groups it re-routes to how far it has read "
                    "each source partition (progress notes on the by-key topics), and a group's watermark follows "
                    "every source partition of its inputs, so a re-routed tuple is late only against its own "
                    "partition, however far a group read ahead (a backlog). Costs a note per stream and group pair "
                    "per batch, and a partition with no records holds the watermark until idle_timeout_ms. The "
                    "query service turns it on for its operator versions")
    start_offsets: dict[str, dict[int, int]] = Field(
        default_factory=dict,
        description="hash mode: source topic -> partition -> the offset a group with no checkpoint starts "
                    "reading at (default: the beginning). The query service starts an operator version this "
                    "way, about a window before its switch barrier (a window-bounded backfill)")
    start_event_ms: int | None = Field(
        default=None,
        description="hash mode: tuples with an event time before this are skipped before the join (counted in "
                    "streamjoin_filtered_tuples{reason=before_start}): no result the job is read for can hold "
                    "them. The query service sets it on an operator version: its barrier minus its longest RANGE")
    max_future_ms: int | None = Field(
        default=300_000, ge=0,
        description="a record whose event time is more than this ahead of the worker's clock is dead-lettered "
                    "(reason future) and never moves a watermark; 0 or null = no limit")

    @model_validator(mode="after")
    def _watermarks_need_repartition(self) -> "JoinSpec":
        if self.repartition_watermarks and (self.mode != "hash" or self.repartition != "auto"):
            raise ValueError("join.repartition_watermarks needs join.mode: hash and join.repartition: auto "
                             "(nothing else re-routes tuples)")
        return self
