"""The job file's `queries:` section: the continuous-query service's regions and their
latencies, how far operators are shared, its HTTP API, and how operator versions start."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from streamjoin.settings.base import StrictModel


class QueriesSpec(StrictModel):
    """StreamReuse (operator sharing between continuous queries): the continuous-query service
    (`streamjoin queries`). The job's `streams` are the catalog queries may name; each shared
    operator runs as a hash-mode job of its own. Regions and their latency matrix are what the
    network-usage cost model weighs."""

    regions: list[str] = Field(default_factory=lambda: ["local"], min_length=1,
                               description="region names, in the order of latency_ms's rows")
    latency_ms: list[list[float]] = Field(
        default_factory=list,
        description="regions x regions link latency (ms) weighing bytes that cross them; empty: 0 within a "
                    "region, 1 between two")
    source_regions: dict[str, str] = Field(default_factory=dict,
                                           description="stream -> the region its producers are in (default: the first)")
    reuse: Literal["relax", "exact", "none"] = Field(
        default="relax",
        description="relax: widen a running operator and compensate (the StreamReuse paper's relaxation); "
                    "exact: share only operators that answer a query unchanged; none: one operator per query")
    port: int = Field(default=8470, ge=0, le=65535, description="the HTTP API's port (0 = any free port)")
    host: str = Field(default="127.0.0.1", description="the HTTP API's address")
    operator_workers: int = Field(default=1, ge=1, le=64, description="workers of each operator's job")
    operator_partitions: int = Field(default=4, ge=1, le=1000, description="partition groups of each operator's job")
    backfill_margin_ms: int = Field(
        default=60_000, ge=0,
        description="a new operator version seeks its sources by record timestamp to (barrier - window - "
                    "lateness - this): how far an event time may run ahead of its record's timestamp")
    barrier_delay_ms: int = Field(
        default=1_000, ge=0,
        description="a switch's event-time barrier lies at least this far past the newest result routed")

    @model_validator(mode="before")
    @classmethod
    def _retired_settings(cls, data: Any) -> Any:
        """Accepted and ignored: `catchup_ms`, which job files written for earlier releases may
        set (an operator version is exact however late it starts: join.repartition_watermarks)."""
        if isinstance(data, dict) and "catchup_ms" in data:
            data = {k: v for k, v in data.items() if k != "catchup_ms"}
        return data

    @model_validator(mode="after")
    def _regions(self) -> "QueriesSpec":
        n = len(self.regions)
        if len(set(self.regions)) != n:
            raise ValueError(f"queries.regions has duplicates: {self.regions}")
        if self.latency_ms and (len(self.latency_ms) != n or any(len(row) != n for row in self.latency_ms)):
            raise ValueError(f"queries.latency_ms must be {n} x {n} (one row and column per region)")
        if any(v < 0 or v != v for row in self.latency_ms for v in row):
            raise ValueError("queries.latency_ms holds non-negative numbers")
        unknown = sorted(set(self.source_regions.values()) - set(self.regions))
        if unknown:
            raise ValueError(f"queries.source_regions names regions {unknown} not in queries.regions {self.regions}")
        return self

    def latency(self, a: str, b: str) -> float:
        """The latency weight between regions `a` and `b`."""
        i, j = self.regions.index(a), self.regions.index(b)
        if self.latency_ms:
            return float(self.latency_ms[i][j])
        return 0.0 if i == j else 1.0
