"""Helm: the Kafka client settings (kafka.client) and secrets (kafka.secret, an
existing Secret as files and as secretKeyRef variables) reach every pod that
makes Kafka clients, and the services load them from what the chart renders.
Same tools as test_deploy.py: helm-python-sdk renders, kubernetes-validate checks."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest

from streamjoin import settings
from streamjoin.settings.kafka import RESERVED_KAFKA_SETTINGS
from tests.unit.test_deploy import CHART, K8S_VERSION, clean, config_job_yaml, container, render

SECRET_NAME = "kafka-credentials"
# What the Secret holds, as `kubectl create secret generic` would store it.
SECRET_DATA = {"password": "scram-pass-9d2", "key-password": "tls-key-pass-51"}
KAFKA_PODS = ("coordinator", "worker", "topics", "sources", "verify")  # every component that makes Kafka clients
SPARK_JOBS = {"sources": {"enabled": True}, "verify": {"enabled": True}}


def _values(mount_path: str = "/etc/streamjoin-kafka") -> dict:
    return {
        "kafka": {
            "client": {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "joins",
                       "ssl.ca.location": f"{mount_path}/ca.crt",
                       "ssl.key.password": {"file": f"{mount_path}/key-password"}},
            "secret": {"name": SECRET_NAME, "mountPath": mount_path, "env": {"sasl.password": "password"}},
        },
    } | SPARK_JOBS


def _kafka_workloads(docs: list[dict]) -> dict[str, dict]:
    """Deployment, StatefulSet and Jobs by component."""
    found = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in docs
             if d["kind"] in {"Deployment", "StatefulSet", "Job"}}
    assert sorted(found) == sorted(KAFKA_PODS)
    return found


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return render(_values())


def test_values_lint_and_every_manifest_validates(docs: list[dict]) -> None:
    report = helm.lint(CHART, _values(), strict=True, kube_version=f"v{K8S_VERSION}")
    assert report["errors"] == [] and not [m for m in report["messages"] if m["severity"] >= 2]
    for doc in docs:
        if not doc["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(clean(doc), K8S_VERSION, strict=True)


def test_secret_reaches_every_pod_that_makes_kafka_clients(docs: list[dict]) -> None:
    for component, workload in _kafka_workloads(docs).items():
        c = container(workload)
        env = {e["name"]: e for e in c["env"]}
        assert env["STREAMJOIN_KAFKA__SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": SECRET_NAME, "key": "password"}, component
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["kafka-secret"]["mountPath"] == "/etc/streamjoin-kafka", component
        assert mounts["kafka-secret"]["readOnly"] is True
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        # group-readable: the pods run as a non-root user whose fsGroup owns the files
        assert volumes["kafka-secret"]["secret"] == {"secretName": SECRET_NAME, "defaultMode": 0o440}, component


def test_no_secret_no_secret_plumbing() -> None:
    for workload in _kafka_workloads(render(SPARK_JOBS)).values():
        c = container(workload)
        assert not [e for e in c["env"] if e["name"].startswith("STREAMJOIN_KAFKA__")]
        assert "kafka-secret" not in {m["name"] for m in c["volumeMounts"]}
    # files only, or variables only
    only_env = _kafka_workloads(render(SPARK_JOBS | {"kafka": {"secret": {
        "name": SECRET_NAME, "mountPath": "", "env": {"sasl.password": "password"}}}}))
    assert all("kafka-secret" not in {m["name"] for m in container(w)["volumeMounts"]} for w in only_env.values())
    only_files = _kafka_workloads(render(SPARK_JOBS | {"kafka": {"secret": {"name": SECRET_NAME}}}))
    for w in only_files.values():
        assert "kafka-secret" in {m["name"] for m in container(w)["volumeMounts"]}
        assert not [e for e in container(w)["env"] if e["name"].startswith("STREAMJOIN_KAFKA__")]


def test_services_load_the_rendered_settings_with_the_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a kubelet would run them: the Secret's keys as files under the mount path and as the
    variables the secretKeyRefs name; the service loads job.yaml and gets every value."""
    mount = tmp_path / "kafka"
    mount.mkdir()
    for key, value in SECRET_DATA.items():
        (mount / key).write_text(value)
    docs = render(_values(str(mount)))
    job_yaml = tmp_path / "job.yaml"
    job_yaml.write_text(config_job_yaml(docs))
    for component, workload in _kafka_workloads(docs).items():
        for var in [v for v in os.environ if v.startswith("STREAMJOIN_")]:
            monkeypatch.delenv(var)
        for e in container(workload)["env"]:
            if e["name"].startswith("STREAMJOIN_") and "secretKeyRef" in e.get("valueFrom", {}):
                ref = e["valueFrom"]["secretKeyRef"]
                assert ref["name"] == SECRET_NAME
                monkeypatch.setenv(e["name"], SECRET_DATA[ref["key"]])
        job = settings.load(job_yaml)
        assert job.kafka_client() == {
            "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "joins",
            "ssl.ca.location": f"{mount}/ca.crt", "ssl.key.password": SECRET_DATA["key-password"],
            "sasl.password": SECRET_DATA["password"]}, component
    assert not any(value in config_job_yaml(docs) for value in SECRET_DATA.values())


@pytest.mark.parametrize("bad, where", [
    ({"kafka": {"client": {"group.id": "mine"}}}, "'group.id'"),
    ({"kafka": {"client": {"sasl.password": {"file": "relative/path"}}}}, "/kafka/client/sasl.password"),
    ({"kafka": {"client": {"sasl.password": {"vault": "x"}}}}, "/kafka/client/sasl.password"),
    ({"kafka": {"secret": {"name": SECRET_NAME, "env": {"transactional.id": "tx"}}}}, "'transactional.id'"),
    # inside the ConfigMap's mount
    ({"kafka": {"secret": {"name": SECRET_NAME, "mountPath": "/etc/streamjoin/kafka"}}}, "/kafka/secret/mountPath"),
    ({"kafka": {"secret": {"name": SECRET_NAME, "mountPath": "relative"}}}, "/kafka/secret/mountPath"),
    ({"kafka": {"clients": {}}}, "'clients' not allowed"),
    ({"job": {"kafka": {"client.id": "set kafka.client instead"}}}, "/job/kafka"),
])
def test_bad_kafka_values_are_refused(bad: dict, where: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
        render(bad)


def test_schema_reserves_what_the_settings_reserve() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert sorted(schema["definitions"]["kafkaProperty"]["not"]["enum"]) == sorted(RESERVED_KAFKA_SETTINGS)
