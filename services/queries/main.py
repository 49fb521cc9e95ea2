"""`streamjoin queries`: the query service process: the HTTP API in front, the router,
source sampling and lifetimes behind it on a thread of their own."""

from __future__ import annotations

import os
import signal
import threading

import structlog
import uvicorn

from streamjoin.services.io import kafka
from streamjoin.services.queries.api import create_app
from streamjoin.services.queries.deploy import Deployer
from streamjoin.services.queries.service import ReuseService
from streamjoin.services.shutdown import StopFlag
from streamjoin.settings import JobSettings

log = structlog.get_logger("queries")


def serve(settings: JobSettings, cluster: kafka.Cluster, deployer: Deployer) -> None:
    """Run the query service until SIGTERM/SIGINT (uvicorn's own handling), then stop its loop.

    `settings`: the service's job (catalog and `queries:`); `deployer`: runs operator versions."""
    kafka.wait_for_broker(cluster, log)
    service = ReuseService(settings, cluster, deployer)
    service.open()
    stop, failed = threading.Event(), threading.Event()
    loop = threading.Thread(target=run_loop, args=(service, stop, failed), name="queries-loop", daemon=True)
    loop.start()
    log.info("query service up", host=settings.queries.host, port=settings.queries.port)
    # uvicorn takes SIGTERM/SIGINT while it serves, and on its way out raises the signal again
    # against the handler it found: with Python's default one the process would die there,
    # before the `finally` below stops the operator versions the deployer started.
    StopFlag().install()
    try:
        uvicorn.run(create_app(service), host=settings.queries.host, port=settings.queries.port, log_level="warning")
    finally:
        stop.set()
        loop.join(30)
        deployer.close()
    if failed.is_set():
        raise SystemExit(1)  # the orchestrator restarts the service; it carries on from its registry


def run_loop(service: ReuseService, stop: threading.Event, failed: threading.Event) -> None:
    """The service's background loop until `stop`. A loop that fails ends the process (sets
    `failed`, then SIGTERM to itself, which uvicorn takes as a stop): an API that goes on
    registering queries while nothing routes their results would be a silent stall."""
    try:
        service.run(stop)
    except Exception:  # noqa: BLE001 - whatever it was, the process must not outlive it
        log.exception("query service loop failed; stopping the service")
        failed.set()
        os.kill(os.getpid(), signal.SIGTERM)
