"""Helpers for ring-mode tests: records decoded the way a worker decodes them
(schemas.codecs DECODERS), and the reference's pair predicate from compiled terms."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from streamjoin.engine.predicates import Term
from streamjoin.engine.reference import ThetaTuple
from streamjoin.schemas.codecs import DECODERS, Decoded
from streamjoin.settings import StreamSpec


def decode(spec: StreamSpec, values: Sequence[bytes | None], partitions: Sequence[int],
           offsets: Sequence[int]) -> Decoded:
    return DECODERS[spec.format](spec, list(values), np.asarray(partitions, np.int32),
                                 np.asarray(offsets, np.int64), np.zeros(len(values), np.int64))


def pair_predicate(terms: Sequence[Term]) -> Callable[[int, ThetaTuple, int, ThetaTuple], bool]:
    """reference_theta_join's pair predicate: every term between the two streams, through
    Term.evaluate on one-pair arrays; memoised, as the reference asks for a pair many times."""
    seen: dict[tuple, bool] = {}

    def holds(i: int, a: ThetaTuple, j: int, b: ThetaTuple) -> bool:
        key = (i, a.ref, j, b.ref)
        if key not in seen:
            pick = {i: a, j: b}
            seen[key] = all(t.evaluate({s: np.array([pick[s].fields[t.side(s)]]) for s in (i, j)})[0]
                            for t in terms if t.streams == {i, j})
        return seen[key]

    return holds
