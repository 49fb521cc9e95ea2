"""The query service's HTTP API, its client and `streamjoin query ...`, over a fake service.

The fake keeps registrations in a dict and "parses" with a trivial rule (a query
starts with a letter), so every path of the API is reachable: 201, 404, 409, 422
from the service, 422 from request validation, 413, 500. The API is also fuzzed
against its own OpenAPI document (tests/unit/queries_api_fuzz.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import uvicorn
import yaml
from fastapi.exceptions import ResponseValidationError
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from streamjoin.cli import app as cli
from streamjoin.job_files import default_job_file
from streamjoin.services.broker import free_port
from streamjoin.services.queries import api
from streamjoin.services.queries.api import (
    MAX_BODY_BYTES, MAX_LIFETIME_S, MAX_SQL_CHARS, QueryRejected, RegisterRequest, create_app,
)
from streamjoin.services.queries.client import QueryClient, QueryRefused, ServiceUnavailable
from tests.unit.queries_api_fuzz import fuzz_app
from tests.profiles import examples

REGIONS = ("eu", "us")
SQL = "SELECT a.k, b.v FROM a [RANGE 5 MINUTES], b [RANGE 1 MINUTE] WHERE a.k = b.k AND a.c IN ('DL', 'UA')"


class FakeQueryService:
    """A QueryService over a dict: one operator per distinct FROM clause, reused by later queries."""

    def __init__(self) -> None:
        self.views: dict[str, dict] = {}
        self.decisions: dict[str, dict] = {}
        self.operators_by_sources: dict[str, dict] = {}
        self.clock_ms = 1_000

    def _plan(self, request: RegisterRequest) -> tuple[str, dict]:
        """(region, ExplainView) for `request`, or QueryRejected as the real service would refuse it."""
        text = request.sql.lstrip()
        if not text[:1].isalpha():
            column = len(request.sql) - len(text) + 1
            raise QueryRejected(422, f"expected SELECT at line 1, column {column}",
                                {"line": 1, "column": column, "token": text[:1]})
        region = request.region or REGIONS[0]
        if region not in REGIONS:
            raise QueryRejected(422, f"unknown region {region!r}: one of {list(REGIONS)}", {"region": region})
        sources = text.partition(" FROM ")[2].partition(" WHERE ")[0] or text
        kind = "reuse" if sources in self.operators_by_sources else "deploy"
        return region, {"decision": {"kind": kind, "sources": sources, "cost": {"deploy": 2.0, "reuse": 1.0}}}

    def register(self, request: RegisterRequest) -> dict:
        region, plan = self._plan(request)
        if any(v["sink"] == request.sink and v["state"] == "running" for v in self.views.values()):
            raise QueryRejected(409, f"sink {request.sink} is taken by a running query", {"sink": request.sink})
        query_id = f"q-{len(self.views) + 1}"
        operator = self.operators_by_sources.setdefault(
            plan["decision"]["sources"],
            {"id": f"op-{len(self.operators_by_sources) + 1}", "version": 0, "sources": ["a", "b"],
             "queries": [], "region": region, "definition": {"from": plan["decision"]["sources"]}})
        operator["queries"].append(query_id)
        self.clock_ms += 1
        self.views[query_id] = {
            "id": query_id, "sql": request.sql, "sink": request.sink, "region": region,
            "lifetime_s": request.lifetime_s, "registered_ms": self.clock_ms, "start_ms": self.clock_ms + 1000,
            "end_ms": None, "state": "running", "operator": operator["id"], "decision": plan["decision"]["kind"]}
        self.decisions[query_id] = plan
        return self.views[query_id]

    def explain(self, request: RegisterRequest) -> dict:
        return self._plan(request)[1]

    def queries(self) -> list[dict]:
        return list(self.views.values())

    def query(self, query_id: str) -> dict:
        return self.views[query_id]

    def explain_query(self, query_id: str) -> dict:
        return self.decisions[query_id]

    def drop(self, query_id: str) -> dict:
        view = self.views[query_id]
        if view["state"] == "dropped":
            raise QueryRejected(409, f"{query_id} was dropped already", {"id": query_id})
        self.clock_ms += 1
        view.update(state="dropped", end_ms=self.clock_ms)
        return view

    def operators(self) -> list[dict]:
        return list(self.operators_by_sources.values())


@pytest.fixture
def service() -> FakeQueryService:
    return FakeQueryService()


@pytest.fixture
def http(service: FakeQueryService) -> TestClient:
    return TestClient(create_app(service))


def _register(http: TestClient, **fields: object) -> httpx.Response:
    return http.post("/queries", json={"sql": SQL, "sink": "alerts"} | fields)


# ----------------------------------------------------------------- happy paths


def test_register_then_read_it_back(http: TestClient) -> None:
    created = _register(http, region="us", lifetime_s=3600)
    assert created.status_code == 201, created.text
    view = created.json()
    assert view["id"] == "q-1" and view["state"] == "running" and view["end_ms"] is None
    assert (view["sql"], view["sink"], view["region"], view["lifetime_s"]) == (SQL, "alerts", "us", 3600.0)
    assert view["operator"] == "op-1" and view["decision"] == "deploy"
    assert http.get("/queries/q-1").json() == view
    assert http.get("/queries").json() == [view]
    assert http.get("/queries/q-1/explain").json()["decision"]["kind"] == "deploy"


def test_defaults_region_and_lifetime(http: TestClient) -> None:
    view = _register(http).json()
    assert view["region"] == REGIONS[0] and view["lifetime_s"] is None


def test_explain_is_a_dry_run(http: TestClient) -> None:
    answer = http.post("/queries/explain", json={"sql": SQL, "sink": "alerts"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["decision"]["kind"] == "deploy"
    assert http.get("/queries").json() == []
    _register(http)
    assert http.post("/queries/explain", json={"sql": SQL, "sink": "more"}).json()["decision"]["kind"] == "reuse"


def test_explain_keeps_the_service_s_free_form_fields(service: FakeQueryService, http: TestClient) -> None:
    _register(http)
    service.decisions["q-1"]["candidates"] = [{"operator": "op-1", "cost": 1.0}]
    assert http.get("/queries/q-1/explain").json()["candidates"] == [{"operator": "op-1", "cost": 1.0}]


def test_drop_keeps_the_query_listed_as_dropped(http: TestClient) -> None:
    _register(http)
    dropped = http.delete("/queries/q-1")
    assert dropped.status_code == 200, dropped.text
    assert dropped.json()["state"] == "dropped" and dropped.json()["end_ms"] is not None
    assert [v["state"] for v in http.get("/queries").json()] == ["dropped"]
    again = http.delete("/queries/q-1")
    assert again.status_code == 409
    assert again.json() == {"error": "q-1 was dropped already", "detail": {"id": "q-1"}}


def test_operators_list_the_queries_they_answer(http: TestClient) -> None:
    _register(http, sink="one")
    _register(http, sink="two")
    [operator] = http.get("/operators").json()
    assert operator["id"] == "op-1" and operator["queries"] == ["q-1", "q-2"]
    assert operator["definition"] == {"from": "a [RANGE 5 MINUTES], b [RANGE 1 MINUTE]"}


def test_healthz(http: TestClient) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}


# ------------------------------------------------------------- refusals (4xx)


def test_bad_query_is_422_with_the_position(http: TestClient) -> None:
    answer = _register(http, sql="  (SELECT")
    assert answer.status_code == 422
    assert answer.json() == {"error": "expected SELECT at line 1, column 3",
                             "detail": {"line": 1, "column": 3, "token": "("}}
    explained = http.post("/queries/explain", json={"sql": "1", "sink": "x"})
    assert explained.status_code == 422 and explained.json()["detail"]["token"] == "1"


def test_service_conflict_is_409(http: TestClient) -> None:
    assert _register(http).status_code == 201
    taken = _register(http)
    assert taken.status_code == 409 and "taken" in taken.json()["error"]


@pytest.mark.parametrize("fields, field", [
    ({"sink": "."}, "body.sink"),
    ({"sink": ".."}, "body.sink"),
    ({"sink": "a/b"}, "body.sink"),
    ({"sink": "x" * 250}, "body.sink"),
    ({"sink": ""}, "body.sink"),
    ({"sql": ""}, "body.sql"),
    ({"sql": "S" * (MAX_SQL_CHARS + 1)}, "body.sql"),
    ({"sql": 7}, "body.sql"),
    ({"region": ""}, "body.region"),
    ({"region": "r" * 65}, "body.region"),
    ({"lifetime_s": 0}, "body.lifetime_s"),
    ({"lifetime_s": -1.5}, "body.lifetime_s"),
    ({"lifetime_s": MAX_LIFETIME_S * 1.01}, "body.lifetime_s"),
    ({"lifetime_s": "60"}, "body.lifetime_s"),  # strict: a string is not a number
    ({"lifetime_s": True}, "body.lifetime_s"),
    ({"colour": "blue"}, "body.colour"),
])
def test_malformed_request_is_422_naming_the_field(http: TestClient, fields: dict, field: str) -> None:
    answer = _register(http, **fields)
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert body["error"].startswith("invalid request: ") and field in body["error"]
    assert [f["field"] for f in body["detail"]] == [field]


def test_edges_of_the_request_limits_are_accepted(http: TestClient) -> None:
    for i, fields in enumerate([{"sink": "..."}, {"sink": "x" * 249}, {"lifetime_s": MAX_LIFETIME_S},
                                {"region": "us"}, {"sql": "S" * MAX_SQL_CHARS}]):
        answer = _register(http, **({"sink": f"s{i}"} | fields))
        assert answer.status_code == 201, (fields, answer.text)


def test_missing_fields_and_bad_json_are_422(http: TestClient) -> None:
    missing = http.post("/queries", json={"sql": SQL})
    assert missing.status_code == 422 and [f["field"] for f in missing.json()["detail"]] == ["body.sink"]
    broken = http.post("/queries", content=b'{"sql": ', headers={"content-type": "application/json"})
    assert broken.status_code == 422 and broken.json()["error"].startswith("invalid request: body")
    listed = http.post("/queries", json=[SQL])
    assert listed.status_code == 422


def test_many_unknown_fields_get_a_bounded_answer(http: TestClient) -> None:
    body = {"sql": SQL, "sink": "s"} | {f"k{i}" + "x" * 500: 1 for i in range(2000)}
    answer = http.post("/queries", json=body)
    assert answer.status_code == 422
    assert len(answer.json()["detail"]) == 20 and "(and 1997 more)" in answer.json()["error"]
    assert len(answer.content) < 20_000


@pytest.mark.parametrize("path, status", [
    ("/queries/q-99", 404), ("/queries/q-99/explain", 404),
    ("/queries/x", 422), ("/queries/q-", 422), ("/queries/q-1x", 422), (f"/queries/q-{'9' * 70}", 422),
    ("/queries/q-1/2", 404), ("/nowhere", 404),
])
def test_unknown_or_malformed_ids(http: TestClient, path: str, status: int) -> None:
    answer = http.get(path)
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"error", "detail"}
    if status == 422:
        assert [f["field"] for f in body["detail"]] == ["path.query_id"]
    if path == "/queries/q-99":
        assert body == {"error": "no query q-99", "detail": {"id": "q-99"}}
    assert http.delete(path).status_code in {status, 405}


def test_wrong_method_is_405_in_the_same_shape(http: TestClient) -> None:
    answer = http.put("/queries", json={})
    assert answer.status_code == 405 and answer.json() == {"error": "Method Not Allowed", "detail": None}


def test_oversized_bodies_are_413_before_parsing(http: TestClient) -> None:
    big = b'{"sql": "' + b"S" * MAX_BODY_BYTES + b'", "sink": "s"}'
    answer = http.post("/queries", content=big, headers={"content-type": "application/json"})
    assert answer.status_code == 413 and "bytes" in answer.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"sql": "'
        for _ in range(MAX_BODY_BYTES // 65_536 + 1):
            yield b"S" * 65_536
        yield b'", "sink": "s"}'

    streamed = http.post("/queries", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert http.get("/queries").json() == []


# ----------------------------------------------------------- server errors (5xx)


class RaisingService(FakeQueryService):
    """A bug: raises what the protocol does not allow."""

    def register(self, request: RegisterRequest) -> dict:
        raise RuntimeError("secret internals")


class MalformedService(FakeQueryService):
    """A bug: answers with a view that breaks the response model."""

    def queries(self) -> list[dict]:
        return [{"id": "q-1"}]  # a QueryView lacking every other field


def test_unexpected_errors_are_500_internal_and_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    logged: list[tuple[str, dict]] = []
    monkeypatch.setattr(api, "log", SimpleNamespace(error=lambda event, **fields: logged.append((event, fields))))
    http = TestClient(create_app(RaisingService()), raise_server_exceptions=False)
    answer = _register(http)
    assert answer.status_code == 500
    assert answer.json() == {"error": "internal", "detail": None}
    assert "secret" not in answer.text
    [(_, fields)] = logged
    assert fields["path"] == "/queries" and str(fields["exc_info"]) == "secret internals"


def test_views_that_break_the_response_model_are_500() -> None:
    http = TestClient(create_app(MalformedService()), raise_server_exceptions=False)
    malformed = http.get("/queries")  # no half views leak out
    assert malformed.status_code == 500 and malformed.json() == {"error": "internal", "detail": None}


def test_query_rejected_needs_a_client_error_status() -> None:
    with pytest.raises(ValueError, match="4xx"):
        QueryRejected(500, "no")


def test_service_is_called_one_request_at_a_time() -> None:
    """FastAPI runs the routes on a thread pool; the service must never see two calls at once."""

    class Slow(FakeQueryService):
        inside = 0
        most = 0

        def register(self, request: RegisterRequest) -> dict:
            Slow.inside += 1
            Slow.most = max(Slow.most, Slow.inside)
            time.sleep(0.01)
            Slow.inside -= 1
            return super().register(request)

    with _serve(create_app(Slow())) as url:
        def register(i: int) -> None:
            assert httpx.post(f"{url}/queries", json={"sql": SQL, "sink": f"s{i}"}).status_code == 201

        threads = [threading.Thread(target=register, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert Slow.most == 1


def test_healthz_answers_while_the_service_is_busy() -> None:
    """Liveness must not queue behind a long registration (the thread pool may be full of them)."""
    release = threading.Event()

    class Stuck(FakeQueryService):
        def register(self, request: RegisterRequest) -> dict:
            release.wait(10)
            return super().register(request)

    with _serve(create_app(Stuck())) as url:
        waiting = [threading.Thread(target=httpx.post, args=(f"{url}/queries",),
                                    kwargs={"json": {"sql": SQL, "sink": f"s{i}"}, "timeout": 15}) for i in range(60)]
        for t in waiting:
            t.start()
        try:
            assert httpx.get(f"{url}/healthz", timeout=2).json() == {"status": "ok"}
        finally:
            release.set()
            for t in waiting:
                t.join()


# ----------------------------------------------------------------- openapi


def test_openapi_documents_the_error_bodies(http: TestClient) -> None:
    doc = http.get("/openapi.json").json()
    register = doc["paths"]["/queries"]["post"]
    assert set(register["responses"]) == {"201", "400", "409", "413", "422", "500"}
    assert register["responses"]["422"]["content"]["application/json"]["schema"] == \
        {"$ref": "#/components/schemas/ErrorBody"}
    request = doc["components"]["schemas"]["RegisterRequest"]
    assert request["additionalProperties"] is False and request["required"] == ["sql", "sink"]
    assert request["properties"]["sql"]["maxLength"] == MAX_SQL_CHARS
    [id_param] = doc["paths"]["/queries/{query_id}"]["delete"]["parameters"]
    assert id_param["schema"]["pattern"] == r"^q-[0-9]{1,62}$"
    assert "HTTPValidationError" not in doc["components"]["schemas"]  # FastAPI's own 422 shape is not served


def test_fuzz_against_the_openapi_document() -> None:
    statuses = fuzz_app(create_app(FakeQueryService()), max_examples=examples(25))
    seen = {status for (label, status) in statuses if label == "POST /queries"}
    assert {201, 422} <= seen, statuses  # the run got past validation and was refused too
    assert any(label == "GET /queries/{query_id}" and status == 404 for label, status in statuses)


@pytest.mark.parametrize("broken, error", [(RaisingService, RuntimeError),
                                           (MalformedService, ResponseValidationError)])
def test_fuzzing_catches_a_broken_service(broken: type[FakeQueryService], error: type[Exception]) -> None:
    """The app answers 500 and re-raises (Starlette's server-error middleware): the fuzz run stops on it."""
    with pytest.raises(error):
        fuzz_app(create_app(broken()), max_examples=examples(5))


# ------------------------------------------------------------------ client


class _serve:
    """Serve `app` with uvicorn on a loopback port in a thread; the context's value is its URL."""

    def __init__(self, app: object) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, FakeQueryService]]:
    service = FakeQueryService()
    with _serve(create_app(service)) as url:
        yield url, service


def test_client_round_trip(served: tuple[str, FakeQueryService]) -> None:
    url, _ = served
    with QueryClient(url) as client:
        view = client.add(SQL, "client-sink", region="us", lifetime_s=60)
        assert client.get(view["id"]) == view
        assert view in client.list()
        assert client.explain(SQL, "other")["decision"]["kind"] == "reuse"
        assert client.explain_query(view["id"])["decision"]["kind"] in {"deploy", "reuse"}
        assert view["id"] in client.operators()[0]["queries"]
        assert client.drop(view["id"])["state"] == "dropped"


def test_client_raises_the_server_s_reason(served: tuple[str, FakeQueryService]) -> None:
    url, _ = served
    with QueryClient(url) as client:
        with pytest.raises(QueryRefused) as refused:
            client.add("?", "s")
        assert refused.value.status == 422 and refused.value.detail == {"line": 1, "column": 1, "token": "?"}
        with pytest.raises(QueryRefused, match="no query q-12345") as unknown:
            client.get("q-12345")
        assert unknown.value.status == 404
        for hostile in ("q-1/explain", "q-1%2Fexplain", "../operators", ""):  # never another endpoint
            with pytest.raises(QueryRefused, match="not a query id") as refused:
                client.get(hostile)
            assert refused.value.status == 422


def test_client_refuses_what_the_server_would_before_sending() -> None:
    client = QueryClient("http://127.0.0.1:9", transport=httpx.MockTransport(lambda r: pytest.fail("sent")))
    for sink, lifetime in (("..", None), ("s", float("inf")), ("s", float("nan")), ("s", 0.0)):
        with pytest.raises(QueryRefused) as refused:
            client.add(SQL, sink, lifetime_s=lifetime)
        assert refused.value.status == 422 and refused.value.detail[0]["field"] in {"sink", "lifetime_s"}


def test_client_unreachable_and_5xx_are_unavailable() -> None:
    with pytest.raises(ServiceUnavailable, match="did not answer"):
        QueryClient(f"http://127.0.0.1:{free_port()}", timeout_s=2).list()
    failing = httpx.MockTransport(lambda r: httpx.Response(500, json={"error": "internal", "detail": None}))
    with pytest.raises(ServiceUnavailable, match="failed \\(500\\): internal"):
        QueryClient("http://q", transport=failing).list()
    not_json = httpx.MockTransport(lambda r: httpx.Response(200, text="<html>"))
    with pytest.raises(ServiceUnavailable, match="not JSON"):
        QueryClient("http://q", transport=not_json).list()


# --------------------------------------------------------------------- CLI

runner = CliRunner()


def test_cli_add_list_explain_drop(served: tuple[str, FakeQueryService]) -> None:
    url, _ = served
    added = runner.invoke(cli, ["query", "add", SQL, "--sink", "cli-sink", "--lifetime-s", "90", "--url", url])
    assert added.exit_code == 0, added.output
    view = json.loads(added.stdout)
    assert view["sink"] == "cli-sink" and view["lifetime_s"] == 90.0
    listed = runner.invoke(cli, ["query", "list", "--json", "--url", url])
    assert view["id"] in {v["id"] for v in json.loads(listed.stdout)}
    table = runner.invoke(cli, ["query", "list", "--url", url])
    assert table.exit_code == 0 and "running" in table.stdout and "[RANGE" in table.stdout
    recorded = runner.invoke(cli, ["query", "explain", "--id", view["id"], "--url", url])
    assert recorded.exit_code == 0 and "kind" in json.loads(recorded.stdout)["decision"]
    dry = runner.invoke(cli, ["query", "explain", SQL, "--sink", "dry", "--url", url])
    assert dry.exit_code == 0 and json.loads(dry.stdout)["decision"]["kind"] == "reuse"
    dropped = runner.invoke(cli, ["query", "drop", view["id"], "--url", url])
    assert dropped.exit_code == 0 and json.loads(dropped.stdout)["state"] == "dropped"
    operators = runner.invoke(cli, ["query", "operators", "--url", url])
    assert operators.exit_code == 0 and "op-1" in operators.stdout


def test_cli_bad_query_exits_2_with_the_reason(served: tuple[str, FakeQueryService]) -> None:
    url, _ = served
    bad = runner.invoke(cli, ["query", "add", "[/oops", "--sink", "s", "--url", url])
    assert bad.exit_code == 2
    assert "expected SELECT at line 1, column 1" in bad.stderr and "token '['" in bad.stderr
    again = runner.invoke(cli, ["query", "drop", "q-404", "--url", url])
    assert again.exit_code == 2 and "no query q-404" in again.stderr
    sink = runner.invoke(cli, ["query", "add", SQL, "--sink", "..", "--url", url])
    assert sink.exit_code == 2 and "sink" in sink.stderr


@pytest.mark.parametrize("args", [[], ["--sink", "s"], [SQL], [SQL, "--sink", "s", "--id", "q-1"]])
def test_cli_explain_needs_sql_with_a_sink_or_an_id(args: list[str]) -> None:
    answer = runner.invoke(cli, ["query", "explain", *args, "--url", "http://127.0.0.1:9"])
    assert answer.exit_code == 2 and "either SQL with --sink" in answer.stderr


def test_cli_unreachable_service_exits_1() -> None:
    answer = runner.invoke(cli, ["query", "list", "--url", f"http://127.0.0.1:{free_port()}"])
    assert answer.exit_code == 1 and "is `streamjoin queries` running?" in answer.stderr


def test_cli_url_defaults_to_the_job_s_queries_address(served: tuple[str, FakeQueryService], tmp_path: Path) -> None:
    url, _ = served
    job = yaml.safe_load(default_job_file().read_text())
    job["queries"] = {"host": "0.0.0.0", "port": int(url.rsplit(":", 1)[1])}  # a bind-all address: asked on loopback
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    answer = runner.invoke(cli, ["query", "list", "--json", "--job", str(path)])
    assert answer.exit_code == 0, answer.output
    assert isinstance(json.loads(answer.stdout), list)
