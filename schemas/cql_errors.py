"""QueryError, the one error of the continuous-query language, and the pieces of
its messages: where a culprit is written (`Spot`), how a token is shown, lists
and "did you mean" hints.
"""

from __future__ import annotations

import difflib
from typing import NamedTuple, Sequence

__all__ = ["QueryError", "Spot", "error_at", "shown", "one_of", "did_you_mean"]


class QueryError(ValueError):
    """A query that cannot be run. `reason` says why, naming the token, stream, column or
    literal at fault and what would fit; `line` and `column` (1-based) and `token` (as
    written) say where, when known. str() is "line L, column C: reason"."""

    def __init__(self, reason: str, line: int | None = None, column: int | None = None,
                 token: str | None = None) -> None:
        super().__init__(f"line {line}, column {column}: {reason}" if line is not None else reason)
        self.reason, self.line, self.column, self.token = reason, line, column, token

    def __reduce__(self) -> tuple:
        return (QueryError, (self.reason, self.line, self.column, self.token))


class Spot(NamedTuple):
    """Where a piece of the query is written: 1-based line and column, and its text."""

    line: int
    column: int
    text: str


def error_at(reason: str, spot: Spot | None = None) -> QueryError:
    """A QueryError for `reason`, placed at `spot` when it is known."""
    return QueryError(reason) if spot is None else QueryError(reason, spot.line, spot.column, spot.text)


def shown(token: str) -> str:
    """A token quoted for a message, cut short when long (a string literal may be 64 KiB)."""
    text = str(token)  # a lark Token is a str whose repr names its type
    return repr(text if len(text) <= 40 else text[:37] + "...")


def one_of(items: Sequence[str], conjunction: str = "or") -> str:
    """`items` listed for a message: "a, b or c"."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {conjunction} {items[-1]}"


def did_you_mean(word: str, known: Sequence[str], render: str = "{}") -> str:
    """A hint naming the known names closest to `word` (case aside), or listing them
    (none when nothing is known); `render` writes one name."""
    if not known:
        return ""
    by_folded = {name.lower(): name for name in known}
    close = difflib.get_close_matches(word.lower(), list(by_folded), n=3, cutoff=0.6)
    if close:
        return f" (did you mean {one_of([render.format(by_folded[name]) for name in close])}?)"
    listed = sorted(known)
    return f" (expected {one_of([render.format(name) for name in listed[:10]] + (['...'] if listed[10:] else []))})"

