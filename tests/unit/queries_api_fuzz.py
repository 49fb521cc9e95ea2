"""Fuzz a query-service app against its own OpenAPI document (schemathesis).

`fuzz_app(app)` loads the document the app serves, generates requests for every
operation (valid ones, and invalid ones that break the schema on purpose), sends
them in-process and checks that no answer is a server error and every answer
conforms to the documented response schema. Deterministic (derandomized, no
example database) and bounded by `max_examples` per operation and mode, so the
lead's tests can run it on the real service too.
"""

from __future__ import annotations

from collections import Counter

import hypothesis
import schemathesis
from fastapi import FastAPI
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error, response_schema_conformance

CHECKS = [not_a_server_error, response_schema_conformance]


def load_schema(app: FastAPI) -> schemathesis.BaseSchema:
    """The OpenAPI document `app` serves at /openapi.json, bound to `app` (no network)."""
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def fuzz_app(app: FastAPI, max_examples: int = 50,
             modes: tuple[GenerationMode, ...] = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)) -> Counter:
    """Fuzz every operation of `app` in each of `modes`; raise on the first failed check.

    Returns how many answers each (operation, status) pair got, so a caller can check the
    run reached the paths it meant to (e.g. some 201s and some 422s for registration)."""
    statuses: Counter = Counter()
    for result in load_schema(app).get_all_operations():
        operation = result.ok()
        for mode in modes:
            if mode is GenerationMode.NEGATIVE and not _takes_input(operation):
                continue  # nothing to break: every request to it is valid
            _fuzz_operation(operation, mode, max_examples, statuses)
    return statuses


def _takes_input(operation: schemathesis.APIOperation) -> bool:
    return bool(operation.body) or any(True for _ in operation.iter_parameters())


def _fuzz_operation(operation: schemathesis.APIOperation, mode: GenerationMode, max_examples: int,
                    statuses: Counter) -> None:
    # No shrinking: it can take minutes on a failure; the failing request is printed unshrunk.
    @hypothesis.settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                         phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
                         suppress_health_check=list(hypothesis.HealthCheck), print_blob=False)
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def exchange(case: schemathesis.Case) -> None:
        response = case.call_and_validate(checks=CHECKS)
        statuses[(operation.label, response.status_code)] += 1

    exchange()
