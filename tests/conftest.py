from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local Spark for the whole run: starting a JVM costs seconds."""
    from streamjoin.services.spark.kafka_source import local_session

    session = local_session("streamjoin-tests")
    yield session
    session.stop()
