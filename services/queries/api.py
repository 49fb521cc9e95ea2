"""The query service's HTTP API (FastAPI) over a `QueryService`.

`create_app(service)` serves register, explain, list, get, drop and the
operators, with an OpenAPI document whose request and response schemas are
exact (the tests fuzz the app against it). Every error body is
`{"error": reason, "detail": ...}`: a refused query says why (a parse error's
line, column and token in `detail`), a malformed request names the field. The
service raises only `QueryRejected` and `KeyError`; anything else is a bug,
logged and answered 500 `{"error": "internal"}` rather than passed off as the
client's fault.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Annotated, Any, Literal, Protocol, TypeVar

import structlog
from fastapi import FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = structlog.get_logger("streamjoin.queries")

QUERY_ID_PATTERN = r"^q-[0-9]{1,62}$"
# Kafka's topic name rules: legal characters, 1..249 of them, and neither "." nor ".."
# (JSON Schema has no lookahead, so: some character that is not a dot, or three dots or more).
SINK_PATTERN = r"^(?:[A-Za-z0-9._-]*[A-Za-z0-9_-][A-Za-z0-9._-]*|\.{3,})$"
MAX_SQL_CHARS = 65_536
MAX_LIFETIME_S = 10 * 365.25 * 86_400
# The largest body a valid request can need: MAX_SQL_CHARS escaped as surrogate pairs
# (12 bytes a character) is 786,432 bytes, plus the other fields.
MAX_BODY_BYTES = 1 << 20
MAX_FIELD_ERRORS = 20  # a body with thousands of unknown keys gets a bounded answer
MAX_FIELD_NAME_CHARS = 120  # unknown keys are the client's text: echo a bounded prefix
DESCRIPTION = ("Register, explain, list and drop continuous queries over the job's streams; queries share "
               "join operators (StreamReuse). Every error answer is {\"error\": reason, \"detail\": ...}: "
               "why a query was refused (a parse error's line, column and token), or the request fields at fault.")


class QueryRejected(Exception):
    """The service refuses a request: `status` (a 4xx; the API documents 400, 409 and 422),
    `reason` (one line for the user), `detail` (machine-readable context, e.g. a parse
    error's line/column/token)."""

    def __init__(self, status: int, reason: str, detail: dict[str, Any] | None = None) -> None:
        if not 400 <= status < 500:
            raise ValueError(f"QueryRejected needs a 4xx status, got {status}")
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.detail = detail


class RegisterRequest(BaseModel):
    """A query to register (or to explain without registering)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    sql: str = Field(min_length=1, max_length=MAX_SQL_CHARS, json_schema_extra={"format": "cql"},
                     description="the continuous query: SELECT cols FROM s [RANGE n unit SLIDE m unit], ... WHERE ...")
    sink: str = Field(min_length=1, max_length=249, pattern=SINK_PATTERN,
                      description="the Kafka topic its results go to (Kafka's topic name rules)")
    region: str | None = Field(default=None, min_length=1, max_length=64,
                               description="the sink's region; null: the first configured region")
    lifetime_s: float | None = Field(default=None, gt=0, le=MAX_LIFETIME_S, allow_inf_nan=False,
                                     description="seconds it runs (at most 10 years); null: until dropped")


class QueryView(BaseModel):
    """A registration as the service reports it."""

    id: str = Field(description="the query's id (q-N)")
    sql: str = Field(description="the query text as registered")
    sink: str = Field(description="the Kafka topic its results go to")
    region: str = Field(description="the sink's region")
    lifetime_s: float | None = Field(description="seconds it runs; null: until dropped")
    registered_ms: int = Field(description="when it was registered (epoch ms)")
    start_ms: int = Field(description="its results are those with event time at or after this (epoch ms)")
    end_ms: int | None = Field(description="... and before this; null while it runs")
    state: Literal["running", "dropped"]
    operator: str = Field(description="the id of the shared operator that answers it")
    decision: str = Field(description="how the planner placed it (e.g. reuse, relax, deploy)")


class ExplainView(BaseModel):
    """The planner's decision and its numbers (candidates, costs); free-form beyond `decision`."""

    model_config = ConfigDict(extra="allow")

    decision: dict[str, Any]


class OperatorView(BaseModel):
    """A deployed shared operator."""

    id: str
    version: int = Field(description="bumped at each relaxation or narrowing")
    sources: list[str] = Field(description="the streams it joins")
    queries: list[str] = Field(description="the ids of the queries it answers")
    region: str = Field(description="the region it runs in")
    definition: dict[str, Any] = Field(description="its relaxed query (windows, joins, selections, projection)")


class Health(BaseModel):
    status: Literal["ok"]


class FieldError(BaseModel):
    field: str = Field(description="where in the request, e.g. body.sink or path.query_id")
    message: str
    type: str


class ErrorBody(BaseModel):
    """Every error answer: `error` says why; `detail` is a refused query's context or, for a
    malformed request, the fields at fault."""

    error: str
    detail: list[FieldError] | dict[str, Any] | None


class QueryService(Protocol):
    """What the API serves. Views are plain dicts shaped like the *View models."""

    def register(self, request: RegisterRequest) -> dict:
        """Register a query; its QueryView. Raises QueryRejected."""
        ...

    def explain(self, request: RegisterRequest) -> dict:
        """Dry run: the ExplainView of the plan it would take. Raises QueryRejected."""
        ...

    def queries(self) -> list[dict]:
        """Every QueryView, running and dropped."""
        ...

    def query(self, query_id: str) -> dict:
        """One QueryView. Raises KeyError when unknown."""
        ...

    def explain_query(self, query_id: str) -> dict:
        """The ExplainView recorded when it was registered. Raises KeyError when unknown."""
        ...

    def drop(self, query_id: str) -> dict:
        """Drop it; its QueryView. Raises KeyError when unknown, QueryRejected(409) when already dropped."""
        ...

    def operators(self) -> list[dict]:
        """Every OperatorView."""
        ...


QueryId = Annotated[str, Path(min_length=3, max_length=64, pattern=QUERY_ID_PATTERN, description="a query id, q-N")]
T = TypeVar("T")


class UnknownQuery(LookupError):
    """A well-formed id the service does not know (404)."""

    def __init__(self, query_id: str) -> None:
        super().__init__(query_id)
        self.query_id = query_id


def create_app(service: QueryService, title: str = "streamjoin queries") -> FastAPI:
    """The HTTP API over `service`.

    `service`: the registry and planner, called from one thread at a time (see Serialised).
    `title`: the OpenAPI document's title."""
    app = FastAPI(title=title, version=metadata.version("streamjoin"), description=DESCRIPTION,
                  responses=_errors(500))
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    _add_error_handlers(app)
    call = Serialised()
    _add_query_routes(app, service, call)
    _add_status_routes(app, service, call)
    return app


class Serialised:
    """Calls a service's methods one at a time: FastAPI runs `def` routes in its thread pool,
    and the service need not be thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, method: Callable[..., T], *args: Any) -> T:
        with self._lock:
            return method(*args)


def _known(lookup: Callable[[str], T], query_id: str) -> T:
    """`lookup(query_id)`, the service's KeyError for an unknown id made a 404."""
    try:
        return lookup(query_id)
    except KeyError:
        raise UnknownQuery(query_id) from None


def _add_query_routes(app: FastAPI, service: QueryService, call: Serialised) -> None:
    """/queries: register, explain, list, get, explain one, drop."""

    @app.post("/queries", status_code=201, response_model=QueryView, operation_id="register",
              responses=_errors(400, 409, 413, 422))
    def register(request: RegisterRequest) -> dict:
        """Register a continuous query: the planner reuses, relaxes or deploys an operator for it."""
        return call(service.register, request)

    @app.post("/queries/explain", response_model=ExplainView, operation_id="explain",
              responses=_errors(400, 409, 413, 422))
    def explain(request: RegisterRequest) -> dict:
        """What registering this query would do, and why (nothing is registered)."""
        return call(service.explain, request)

    @app.get("/queries", response_model=list[QueryView], operation_id="list_queries")
    def list_queries() -> list[dict]:
        """Every registered query, running and dropped."""
        return call(service.queries)

    @app.get("/queries/{query_id}", response_model=QueryView, operation_id="get_query",
             responses=_errors(404, 422))
    def get_query(query_id: QueryId) -> dict:
        return call(_known, service.query, query_id)

    @app.get("/queries/{query_id}/explain", response_model=ExplainView, operation_id="explain_query",
             responses=_errors(404, 422))
    def explain_query(query_id: QueryId) -> dict:
        """The decision recorded when the query was registered."""
        return call(_known, service.explain_query, query_id)

    @app.delete("/queries/{query_id}", response_model=QueryView, operation_id="drop_query",
                responses=_errors(404, 409, 422))
    def drop_query(query_id: QueryId) -> dict:
        """Stop a query: its operator is narrowed, or removed when no other query uses it."""
        return call(_known, service.drop, query_id)


def _add_status_routes(app: FastAPI, service: QueryService, call: Serialised) -> None:
    """/operators and /healthz."""

    @app.get("/operators", response_model=list[OperatorView], operation_id="list_operators")
    def list_operators() -> list[dict]:
        """The deployed shared operators and the queries each answers."""
        return call(service.operators)

    @app.get("/healthz", response_model=Health, operation_id="health")
    async def health() -> dict:
        """The API answers. On the event loop, not the thread pool, and without the service:
        requests queued behind a long registration must not fail the liveness probe."""
        return {"status": "ok"}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for error statuses, all with the ErrorBody schema."""
    return {status: {"model": ErrorBody} for status in statuses}


def _add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(QueryRejected, _rejected)
    app.add_exception_handler(UnknownQuery, _unknown)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal)


def _error(status: int, reason: str, detail: Any = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": reason, "detail": detail})


async def _rejected(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, QueryRejected)
    return _error(exc.status, exc.reason, exc.detail)


async def _unknown(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, UnknownQuery)
    return _error(404, f"no query {exc.query_id}", {"id": exc.query_id})


async def _invalid(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    reason, fields = describe_validation(exc.errors())
    return _error(422, reason, fields)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    """Routing errors (unknown path 404, wrong method 405) in the same shape as the rest."""
    assert isinstance(exc, HTTPException)
    return JSONResponse(status_code=exc.status_code, headers=exc.headers,
                        content={"error": str(exc.detail), "detail": None})


async def _internal(request: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected error answering a request", method=request.method, path=request.url.path,
              exc_info=exc)
    return _error(500, "internal")


def describe_validation(errors: Sequence[Any]) -> tuple[str, list[dict[str, str]]]:
    """pydantic's errors as (one line naming the fields, a bounded list of FieldError dicts).
    The input values are left out: they are the client's, and can be large."""
    fields = [{"field": _field_name(e["loc"]), "message": str(e["msg"]), "type": str(e["type"])}
              for e in errors[:MAX_FIELD_ERRORS]]
    shown = "; ".join(f"{f['field']}: {f['message']}" for f in fields[:3])
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return f"invalid request: {shown}{more}", fields


def _field_name(loc: Sequence[Any]) -> str:
    name = ".".join(str(part) for part in loc) or "request"
    return name if len(name) <= MAX_FIELD_NAME_CHARS else name[:MAX_FIELD_NAME_CHARS] + "..."


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is answered 413 before any of it is
    parsed, whether it declares its length or arrives chunked (uvicorn has no limit)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left: nobody to answer
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                too_large = _error(413, f"the request body is over {self.max_bytes} bytes")
                await too_large(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(bytes(body), receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the buffered body over once, then the client's own messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay

