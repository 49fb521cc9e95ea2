"""A client of the query service's HTTP API (what `streamjoin query ...` uses).

Two typed failures: `QueryRefused`, the service answered 4xx (its reason and
detail: a parse error's position, the fields at fault), and
`ServiceUnavailable`, it did not answer usefully (unreachable, timed out,
a 5xx, or not JSON).
"""

from __future__ import annotations

import re
from typing import Any

import httpx
from pydantic import ValidationError

from streamjoin.services.queries.api import QUERY_ID_PATTERN, RegisterRequest, describe_validation


class QueryClientError(Exception):
    """Either way the request failed."""


class QueryRefused(QueryClientError):
    """A 4xx answer: `status`, `reason` (the server's `error`), `detail` (as the server sent it)."""

    def __init__(self, status: int, reason: str, detail: Any = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.detail = detail


class ServiceUnavailable(QueryClientError):
    """The service could not be reached or answered with an error of its own."""


class QueryClient:
    """The query service at `base_url` (e.g. http://127.0.0.1:8470).

    `timeout_s`: per request; a registration may wait for an operator's relaxation to be
    written, so the default is generous. `transport`: an httpx transport to use instead
    of the network (tests)."""

    def __init__(self, base_url: str, timeout_s: float = 30.0, transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "QueryClient":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def add(self, sql: str, sink: str, region: str | None = None, lifetime_s: float | None = None) -> dict:
        """Register a query; its registration view."""
        return self._send("POST", "/queries", json=_request(sql, sink, region, lifetime_s))

    def explain(self, sql: str, sink: str, region: str | None = None, lifetime_s: float | None = None) -> dict:
        """What registering the query would do (nothing is registered)."""
        return self._send("POST", "/queries/explain", json=_request(sql, sink, region, lifetime_s))

    def explain_query(self, query_id: str) -> dict:
        """The decision recorded for a registered query."""
        return self._send("GET", f"{_query_path(query_id)}/explain")

    def get(self, query_id: str) -> dict:
        return self._send("GET", _query_path(query_id))

    def drop(self, query_id: str) -> dict:
        """Drop a query; its view, now dropped."""
        return self._send("DELETE", _query_path(query_id))

    def operators(self) -> list[dict]:
        return self._send("GET", "/operators")

    def list(self) -> list[dict]:
        """Every registered query, running and dropped."""
        return self._send("GET", "/queries")

    def _send(self, method: str, path: str, json: dict | None = None) -> Any:
        try:
            response = self._http.request(method, path, json=json)
        except httpx.HTTPError as e:
            raise ServiceUnavailable(f"the query service at {self.base_url} did not answer: {e}") from e
        return _answer(response, self.base_url)


def _request(sql: str, sink: str, region: str | None, lifetime_s: float | None) -> dict:
    """The request body, checked here as the server would check it: a bad field (a sink Kafka
    would refuse, an infinite lifetime that JSON cannot even carry) is refused the same way."""
    try:
        request = RegisterRequest(sql=sql, sink=sink, region=region, lifetime_s=lifetime_s)
    except ValidationError as e:
        reason, fields = describe_validation(e.errors())
        raise QueryRefused(422, reason, fields) from None
    return request.model_dump()


def _query_path(query_id: str) -> str:
    """/queries/<id>, for a well-formed id only: the server decodes %2F before routing, so
    quoting alone would let "q-1/explain" reach another endpoint."""
    if not re.fullmatch(QUERY_ID_PATTERN, query_id):
        message = "is not a query id (q-N)"
        raise QueryRefused(422, f"invalid request: path.query_id: {query_id[:80]!r} {message}",
                           [{"field": "path.query_id", "message": message, "type": "string_pattern_mismatch"}])
    return f"/queries/{query_id}"


def _answer(response: httpx.Response, base_url: str) -> Any:
    """The JSON body of a 2xx answer; QueryRefused for a 4xx, ServiceUnavailable otherwise."""
    try:
        body = response.json()
    except ValueError:
        raise ServiceUnavailable(f"{base_url} answered {response.status_code} with a body that is not JSON: "
                                 "is it the query service?") from None
    if response.is_success:
        return body
    error = body.get("error") if isinstance(body, dict) else None
    if 400 <= response.status_code < 500:
        reason = error if isinstance(error, str) else f"refused ({response.status_code})"
        raise QueryRefused(response.status_code, reason, body.get("detail") if isinstance(body, dict) else None)
    raise ServiceUnavailable(f"the query service at {base_url} failed ({response.status_code}): {error or body}")
