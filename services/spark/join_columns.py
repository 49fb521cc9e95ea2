"""The column names and Column helpers `verify`'s oracles, input decoding and
comparison share.

A tuple's identity is (partition, offset) of its input record; a result's is
the ordered tuple of its inputs' identities, one per stream. Inside `verify`
every ref column is `p<i>` / `o<i>` for stream i in join order, whichever
oracle made it: that is what lets `compare` meet expected and produced results.
"""

from __future__ import annotations

from functools import reduce

import numpy as np
from pyspark.sql import Column
from pyspark.sql import functions as F

NO_BOUND = int(np.iinfo(np.int64).max)  # `until` of a tuple no T can push out


def p_ref(i: int) -> str:
    """The partition ref column of stream i."""
    return f"p{i}"


def o_ref(i: int) -> str:
    """The offset ref column of stream i."""
    return f"o{i}"


def ref_names(m: int) -> list[str]:
    """A result's ref columns for m streams: p0, o0, ..., p<m-1>, o<m-1>."""
    return [c for i in range(m) for c in (p_ref(i), o_ref(i))]


def quoted(name: str) -> Column:
    """A column whose name holds dots (`r.partition`)."""
    return F.col(f"`{name}`")


def all_of(conditions: list[Column]) -> Column:
    """The conjunction of `conditions`."""
    return reduce(lambda a, b: a & b, conditions)
