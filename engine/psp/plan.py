"""What a ring node needs to know about the query: streams, windows, the
predicate terms and each arriving stream's join order, plus which columns a
partial result must carry from each member to the steps still ahead."""

from __future__ import annotations

from dataclasses import dataclass

from streamjoin.engine.block import ARR, OFF, PART, TS
from streamjoin.engine.predicates import Term

REF_COLUMNS = (PART, OFF, TS, ARR)  # what every member contributes to a result's identity and delay


@dataclass(frozen=True)
class RingStream:
    name: str
    topic: str
    range_ms: int | None
    rows: int | None
    payload: tuple[str, ...]  # fields copied into results (bytes fields are not)

    @property
    def rows_window(self) -> bool:
        return self.rows is not None

    @property
    def size(self) -> int:
        """Window size in its own unit: ms for RANGE, tuples for ROWS."""
        return int(self.rows if self.rows is not None else self.range_ms)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RingPlan:
    streams: tuple[RingStream, ...]
    terms: tuple[Term, ...]
    orders: tuple[tuple[int, ...], ...]  # per trigger stream: the other streams in the order it probes them
    # (the head's choice rides on every RoundInfo, so all nodes probe alike)

    @property
    def m(self) -> int:
        return len(self.streams)

    def member_columns(self, stream: int, joined: frozenset[int]) -> list[str]:
        """Columns of member `stream` a partial holding `joined` still needs:
        its refs, its payload, and its side of every term with a stream not yet joined."""
        later = [t.side(stream) for t in self.terms if stream in t.streams and not (t.streams - {stream}) <= joined]
        cols = list(REF_COLUMNS) + list(self.streams[stream].payload)
        return cols + [f for f in dict.fromkeys(later) if f not in cols]


def prefixed(stream: int, column: str) -> str:
    """A member's column inside a partial result block."""
    return f"{stream}|{column}"


def count_column(stream: int) -> str:
    """On a trigger: how many tuples of `stream` were released up to and including it."""
    return f"_cnt{stream}"
