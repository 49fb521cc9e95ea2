"""The job's Kafka client settings (SASL passwords, TLS keys) travel to Spark as data
source options; no plan Spark shows and no line of its log may carry their values."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamjoin.services.kafka import Cluster
from streamjoin.services.spark.kafka_source import NAME, options
from streamjoin.services.spark.session import spark_log_path

pytestmark = pytest.mark.spark

SECRET = "Hunter2-S3cr3t"
# Settings a job on a secured cluster sets: keys that say "password" and keys that do not.
CLIENT = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "svc",
          "sasl.password": SECRET, "ssl.key.password": SECRET, "ssl.key.pem": f"-----BEGIN KEY-----{SECRET}",
          "sasl.oauthbearer.client.secret": SECRET}
EXPLAIN_MODES = ("simple", "extended", "codegen", "cost", "formatted")


def test_plans_and_logs_never_show_client_settings(spark, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = Cluster("127.0.0.1:9", CLIENT)  # never contacted: planning a read needs no broker
    assert SECRET in options(cluster)["client"], "the settings do travel as options"
    frame = spark.read.format(NAME).options(**options(cluster)).option("topics", "t").load()
    for mode in EXPLAIN_MODES:
        frame.explain(mode=mode)
        plan = capsys.readouterr().out
        assert NAME in plan, f"the {mode} plan shows the Kafka read"
        assert SECRET not in plan, mode
    assert SECRET not in Path(spark_log_path()).read_text()
