from __future__ import annotations

from typing import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator["SparkSession"]:  # noqa: F821
    """One local Spark for the whole run: starting a JVM costs seconds."""
    from services.spark.kafka_source import local_session

    session = local_session("streamjoin-tests")
    yield session
    session.stop()
