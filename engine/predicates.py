"""Join predicates for ring mode: ANDed terms between two streams' fields.

    eq    left == right
    band  abs(left - right) <= within
    udf   a registered vectorised callable: udf(left_values, right_values, **args) -> bool mask

A term is evaluated on aligned candidate pairs (two equally long arrays), never
tuple by tuple. UDFs are user code: a call that raises or returns anything but
one bool per pair is a `UdfFailure`, which the caller isolates to the probe
rows involved (they go to the dead-letter topic; their pairs count as no match).
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import numpy as np

Udf = Callable[..., np.ndarray]
UDF_ERROR = "udf-error"  # dead-letter reason of a record whose probe met a failing UDF


class PredicateError(ValueError):
    """A predicate that cannot run: unknown or unimportable UDF, unknown field."""


class UdfFailure(RuntimeError):
    """A UDF raised (`systematic=False`: it may depend on the data) or returned
    the wrong shape (`systematic=True`: no subset of the pairs will do better)."""

    def __init__(self, message: str, systematic: bool) -> None:
        super().__init__(message)
        self.systematic = systematic


@dataclass(frozen=True)
class Term:
    left: tuple[int, str]  # (stream index, field)
    right: tuple[int, str]
    kind: Literal["eq", "band", "udf"]
    within: float = 0.0
    udf_name: str = ""
    udf: Udf | None = None
    args: Mapping[str, Any] = field(default_factory=dict)

    @property
    def streams(self) -> frozenset[int]:
        return frozenset((self.left[0], self.right[0]))

    def side(self, stream: int) -> str:
        """This term's field on `stream`'s side."""
        return self.left[1] if self.left[0] == stream else self.right[1]

    def other(self, stream: int) -> tuple[int, str]:
        return self.right if self.left[0] == stream else self.left

    def evaluate(self, values: Mapping[int, np.ndarray]) -> np.ndarray:
        """Mask over aligned pairs; `values[s]` holds stream s's field of this term."""
        a, b = values[self.left[0]], values[self.right[0]]
        if self.kind == "eq":
            return a == b
        if self.kind == "band":
            return np.abs(a.astype(np.float64) - b.astype(np.float64)) <= self.within
        assert self.udf is not None
        try:
            mask = self.udf(a, b, **self.args)
        except Exception as e:  # user code: any failure is isolated, never fatal
            raise UdfFailure(f"UDF {self.udf_name!r} raised {type(e).__name__}: {e}", systematic=False) from e
        mask = np.asarray(mask)
        if mask.shape != (len(a),) or mask.dtype != np.bool_:
            raise UdfFailure(f"UDF {self.udf_name!r} returned {mask.dtype}{list(mask.shape)}, "
                             f"expected one bool per pair: bool[{len(a)}]", systematic=True)
        return mask


def evaluate_isolated(term: Term, values: Mapping[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray, str]:
    """(mask, failed, first error) of a term over aligned pairs, never raising.

    Where a UDF raises, the call is bisected down to the pairs it raises on, so
    a pair fails exactly when the UDF fails on it alone (this costs calls only on
    the error path: a healthy UDF is one call). A wrong-shaped answer fails the
    whole call. Failed pairs are no match; the engine and the verifier share
    this rule, so both agree on what a failing UDF means."""
    n = len(next(iter(values.values())))
    mask, failed = np.zeros(n, bool), np.zeros(n, bool)
    detail = [""]

    def run(lo: int, hi: int) -> None:
        try:
            mask[lo:hi] = term.evaluate({k: v[lo:hi] for k, v in values.items()})
            return
        except UdfFailure as e:
            detail[0] = detail[0] or str(e)
            if hi - lo == 1 or e.systematic:
                failed[lo:hi] = True
                return
        mid = (lo + hi) // 2
        run(lo, mid)
        run(mid, hi)

    if n:
        run(0, n)
    return mask, failed, detail[0]


# The folders mapped into the `streamjoin` namespace: a UDF reference spelled without
# it ('engine.udfs:f') still loads, with a warning.
_NAMESPACE_FOLDERS = ("engine", "state", "schemas", "topology", "services")


def load_udf(name: str, target: str) -> Udf:
    """Import 'module:callable'; fail with a message that says what to fix."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise PredicateError(f"join.udfs.{name}: {target!r} must look like 'package.module:function'")
    if module_name.split(".")[0] in _NAMESPACE_FOLDERS:
        module_name = f"streamjoin.{module_name}"
        warnings.warn(f"join.udfs.{name}: {target!r} names a module outside the streamjoin namespace; "
                      f"write '{module_name}:{attr}'", DeprecationWarning, stacklevel=2)
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise PredicateError(f"join.udfs.{name}: cannot import {target!r}: {e}") from e
    if not callable(fn):
        raise PredicateError(f"join.udfs.{name}: {target!r} is not callable")
    return fn


def compile_terms(stream_names: list[str], terms: list[Any], udfs: Mapping[str, str]) -> tuple[Term, ...]:
    """Settings' PredicateTerms -> Terms with stream indexes and loaded UDFs."""
    index = {n: i for i, n in enumerate(stream_names)}
    loaded = {name: load_udf(name, target) for name, target in udfs.items()}
    out = []
    for t in terms:
        (ls, lf), (rs, rf) = t.left.split(".", 1), t.right.split(".", 1)
        if t.udf is not None and t.udf not in loaded:
            raise PredicateError(f"unknown UDF {t.udf!r}: register it under join.udfs")
        out.append(Term((index[ls], lf), (index[rs], rf), t.kind, float(t.within or 0.0), t.udf or "",
                        loaded.get(t.udf or ""), dict(t.args)))
    return tuple(out)


def terms_between(terms: tuple[Term, ...], stream: int, members: frozenset[int]) -> list[Term]:
    """The terms that become decidable when `stream` joins a partial holding `members`."""
    return [t for t in terms if stream in t.streams and (t.streams - {stream}) <= members]
