"""The job's `kafka:` section: librdkafka properties from the job file, from
STREAMJOIN_KAFKA__* and from {file:} / {env:} references; reserved properties
refused with exit code 2; secrets masked wherever settings are shown, and kept
out of the job file the launcher writes for its child processes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from streamjoin.cli import app
from streamjoin.job_files import default_job_file
from streamjoin.launcher import write_job
from streamjoin.services.io.kafka import Cluster
from streamjoin.services.spark.kafka_source import NAME as KAFKA_SOURCE, options
from streamjoin.settings import JobSettings, SettingsError, load
from streamjoin.settings.kafka import RESERVED_KAFKA_SETTINGS, KafkaSecret, is_secret

SECRET = "s3cret-value-41"
MASK = "**********"
runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_kafka_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests set the STREAMJOIN_KAFKA__* variables they mean; none leak in from the caller's shell."""
    for var in [v for v in os.environ if v.upper().startswith("STREAMJOIN_KAFKA")]:
        monkeypatch.delenv(var)


def _job_file(tmp_path: Path, kafka: object) -> Path:
    """The default job file with its `kafka:` section set to `kafka`."""
    data = yaml.safe_load(default_job_file().read_text()) | {"kafka": kafka}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _secret_file(tmp_path: Path, text: str, name: str = "password") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------ sources


def test_settings_from_the_job_file(tmp_path: Path) -> None:
    path = _job_file(tmp_path, {"security.protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "client.id": "joins",
                                "socket.timeout.ms": 30000, "sasl.password": SECRET})
    client = load(path).kafka_client()
    assert client == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "client.id": "joins",
                      "socket.timeout.ms": 30000, "sasl.password": SECRET}


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMJOIN_KAFKA__SASL_PASSWORD", SECRET)
    monkeypatch.setenv("STREAMJOIN_KAFKA__SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    job = load(default_job_file())
    assert job.kafka_client() == {"sasl.password": SECRET, "security.protocol": "SASL_PLAINTEXT"}
    # the secret stays in the environment: a job file for a child process names the variable
    assert job.job_file_data()["kafka"]["sasl.password"] == {"env": "STREAMJOIN_KAFKA__SASL_PASSWORD"}


def test_environment_overrides_the_file_per_property(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _job_file(tmp_path, {"sasl.password": {"file": str(_secret_file(tmp_path, "from-file"))},
                                "sasl.username": "file-user"})
    monkeypatch.setenv("STREAMJOIN_KAFKA__SASL_PASSWORD", SECRET)
    assert load(path).kafka_client() == {"sasl.password": SECRET, "sasl.username": "file-user"}


def test_file_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _secret_file(tmp_path, SECRET + "\n")  # as `echo` or a Secret created from a file leaves it
    monkeypatch.chdir(tmp_path)
    job = load(_job_file(tmp_path, {"ssl.key.password": {"file": "password"}}))
    assert job.kafka_client() == {"ssl.key.password": SECRET}
    # relative to the working directory at load, written absolute for children that start elsewhere
    assert job.job_file_data()["kafka"]["ssl.key.password"] == {"file": str(tmp_path / "password")}


def test_env_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_CLIENT_SECRET", SECRET)
    job = load(_job_file(tmp_path, {"sasl.oauthbearer.client.secret": {"env": "KAFKA_CLIENT_SECRET"}}))
    assert job.kafka_client() == {"sasl.oauthbearer.client.secret": SECRET}


def test_a_referenced_value_is_a_secret_whatever_its_property(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_USER", "joins-user")
    job = load(_job_file(tmp_path, {"sasl.username": {"env": "KAFKA_USER"}, "client.id": "joins"}))
    assert isinstance(job.kafka["sasl.username"], KafkaSecret)
    assert job.kafka["client.id"] == "joins"
    assert job.kafka_client() == {"sasl.username": "joins-user", "client.id": "joins"}


@pytest.mark.parametrize("name, secret", [
    ("sasl.password", True), ("ssl.key.password", True), ("ssl.keystore.password", True), ("ssl.key.pem", True),
    ("sasl.oauthbearer.client.secret", True), ("sasl.oauthbearer.config", True),
    ("sasl.oauthbearer.assertion.private.key.passphrase", True), ("some.future.password", True),
    ("sasl.username", False), ("ssl.ca.pem", False), ("ssl.certificate.pem", False), ("ssl.key.location", False),
    ("security.protocol", False), ("client.id", False),
])
def test_which_properties_are_secret(name: str, secret: bool) -> None:
    assert is_secret(name) is secret


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("prop", sorted(RESERVED_KAFKA_SETTINGS))
def test_reserved_property_in_the_job_file_exits_2_naming_it(tmp_path: Path, prop: str) -> None:
    result = runner.invoke(app, ["topics", "check", "--job", str(_job_file(tmp_path, {prop: "x"})),
                                 "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert f"{prop} is set by streamjoin" in result.output and "kafka" in result.output


def test_reserved_property_from_the_environment_exits_2_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMJOIN_KAFKA__ENABLE_IDEMPOTENCE", "false")
    result = runner.invoke(app, ["status", "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert "enable.idempotence is set by streamjoin" in result.output


@pytest.mark.parametrize("reference, words", [
    ({"file": "/no/such/file"}, "sasl.password: cannot read {file: /no/such/file}: No such file or directory"),
    ({"file": "."}, "sasl.password: cannot read {file: "),
    ({"file": "empty"}, "sasl.password: {file: "),
    ({"file": "binary"}, "is not UTF-8 text"),
    ({"env": "STREAMJOIN_TEST_UNSET"}, "sasl.password: {env: STREAMJOIN_TEST_UNSET} names a variable that is not set"),
    ({"file": "a", "env": "B"}, "sasl.password: a reference is {file: PATH} or {env: NAME}"),
    ({"path": "a"}, "sasl.password: a reference is {file: PATH} or {env: NAME}"),
])
def test_bad_reference_exits_2_naming_the_property(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   reference: dict, words: str) -> None:
    monkeypatch.chdir(tmp_path)
    _secret_file(tmp_path, "", "empty")
    (tmp_path / "binary").write_bytes(b"\xff\xfe" + SECRET.encode())
    monkeypatch.delenv("STREAMJOIN_TEST_UNSET", raising=False)
    result = runner.invoke(app, ["topics", "check", "--job", str(_job_file(tmp_path, {"sasl.password": reference})),
                                 "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert words in result.output and "kafka" in result.output


def test_empty_secret_file_is_refused(tmp_path: Path) -> None:
    path = _job_file(tmp_path, {"sasl.password": {"file": str(_secret_file(tmp_path, "\n"))}})
    with pytest.raises(SettingsError, match=r"sasl.password: \{file: .*\} is empty"):
        load(path)


def test_value_of_the_wrong_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="socket.timeout.ms: give a string, number or boolean"):
        load(_job_file(tmp_path, {"socket.timeout.ms": [1, 2]}))


def test_errors_never_show_a_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A validation error elsewhere in the job (here a reserved property) must not echo the kafka section."""
    monkeypatch.setenv("STREAMJOIN_KAFKA__SASL_PASSWORD", SECRET)
    path = _job_file(tmp_path, {"ssl.key.password": SECRET, "group.id": "mine"})
    with pytest.raises(SettingsError) as caught:
        load(path, partitions=0)
    assert "partitions" in str(caught.value) and "group.id" in str(caught.value)
    assert SECRET not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no ValidationError text chained


# ----------------------------------------------------------------- masking


def test_secrets_are_masked_wherever_settings_are_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMJOIN_KAFKA__SASL_PASSWORD", SECRET)
    monkeypatch.setenv("KEY_PASSWORD", SECRET + "-key")
    path = _job_file(tmp_path, {"ssl.keystore.password": SECRET + "-inline",
                                "ssl.key.password": {"env": "KEY_PASSWORD"},
                                "ssl.key.pem": {"file": str(_secret_file(tmp_path, SECRET + "-pem"))}})
    job = load(path, bootstrap="kafka:9092")
    shown = [repr(job), str(job), job.model_dump_json(), json.dumps(job.model_dump(mode="json")), repr(job.kafka),
             repr(Cluster.of(job))]
    assert all(SECRET not in text for text in shown)
    assert json.loads(job.model_dump_json())["kafka"] == {"sasl.password": MASK, "ssl.keystore.password": MASK,
                                                          "ssl.key.password": MASK, "ssl.key.pem": MASK}
    assert job.kafka_client()["ssl.key.pem"] == SECRET + "-pem"  # librdkafka gets the value


def test_a_masked_dump_loads_back(tmp_path: Path) -> None:
    """Spark's workload source gets the job as JSON (masked): it must load, secrets staying masked."""
    job = load(_job_file(tmp_path, {"sasl.password": SECRET, "client.id": "joins"}))
    again = JobSettings.model_validate_json(job.model_dump_json())
    assert again.kafka_client() == {"sasl.password": MASK, "client.id": "joins"}
    assert again.streams == job.streams


def test_spark_plans_do_not_show_client_secrets(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    job = load(_job_file(tmp_path, {"sasl.password": SECRET}), bootstrap="127.0.0.1:1")
    frame = spark.read.format(KAFKA_SOURCE).options(**options(Cluster.of(job))).option("topics", "t").load()
    plans = frame._jdf.queryExecution().toString()  # parsed, analysed, optimised and physical, as Spark logs them
    assert "BatchScan streamjoin-kafka" in plans and SECRET not in plans


# ------------------------------------------------------- the launcher's job file


def test_launcher_job_file_keeps_references_and_loads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMJOIN_KAFKA__SASL_PASSWORD", SECRET)
    monkeypatch.setenv("KEY_PASSWORD", SECRET + "-key")
    pem = _secret_file(tmp_path, SECRET + "-pem")
    job = load(_job_file(tmp_path, {"ssl.key.password": {"env": "KEY_PASSWORD"}, "ssl.key.pem": {"file": str(pem)},
                                    "client.id": "joins"}))
    written = write_job(job, tmp_path / "launch" / "job.yaml")
    text = written.read_text()
    assert SECRET not in text
    assert yaml.safe_load(text)["kafka"] == {"sasl.password": {"env": "STREAMJOIN_KAFKA__SASL_PASSWORD"},
                                             "ssl.key.password": {"env": "KEY_PASSWORD"},
                                             "ssl.key.pem": {"file": str(pem)}, "client.id": "joins"}
    assert load(written) == job  # a child process loads the same settings, secrets included
    assert load(written).kafka_client() == job.kafka_client()


def test_launcher_job_file_with_an_inline_secret_is_owner_only(tmp_path: Path) -> None:
    job = load(_job_file(tmp_path, {"sasl.password": SECRET}))
    target = tmp_path / "launch" / "job.yaml"
    target.parent.mkdir()
    target.write_text("old")
    target.chmod(0o644)  # an existing file is tightened too
    written = write_job(job, target)
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert load(written).kafka_client() == {"sasl.password": SECRET}


def test_the_transactions_section_reaches_the_transactional_producers_and_their_calls(tmp_path: Path) -> None:
    """`transactions:` in a job file sets transaction.timeout.ms of every transactional producer
    (through the job's Cluster) and the waits of init and commit (the one transaction object)."""
    from streamjoin.services.io.transactions import Transactions

    data = yaml.safe_load(default_job_file().read_text()) | {
        "transactions": {"transaction_timeout_ms": 45_000, "init_transactions_timeout_s": 7, "commit_timeout_s": 9}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    job = load(path, bootstrap="127.0.0.1:1")
    cluster = Cluster.of(job)
    assert cluster.transactions.transaction_timeout_ms == 45_000
    calls: list[tuple[str, float]] = []

    class Recording:
        def init_transactions(self, timeout: float) -> None:
            calls.append(("init", timeout))

        def commit_transaction(self, timeout: float) -> None:
            calls.append(("commit", timeout))

    transactions = Transactions(Recording(), job.transactions, worker="w0")  # type: ignore[arg-type]
    transactions.init()
    transactions.commit()
    assert calls == [("init", 7), ("commit", 9)]
    with pytest.raises(SettingsError, match="transaction_timeout_ms"):
        load(path, bootstrap="127.0.0.1:1", transactions={"transaction_timeout_ms": -1})


def test_the_consumers_section_sets_data_and_control_fetch_waits(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`consumers:` sets fetch.wait.max.ms of the data consumers (over our tuning, under the job's
    `kafka:` section) and of the control-plane consumers (over both)."""
    from streamjoin.services.io import kafka

    made: list[dict] = []
    monkeypatch.setattr(kafka, "Consumer", lambda conf: made.append(conf))
    monkeypatch.delenv("STREAMJOIN_CONSUMERS__FETCH_WAIT_MS", raising=False)
    path = _job_file(tmp_path, {})
    job = load(path, bootstrap="127.0.0.1:1", consumers={"fetch_wait_ms": 70, "control_fetch_wait_ms": 900})
    Cluster.of(job).consumer("g")
    Cluster.of(job).control_consumer("g-control")
    assert [(c["group.id"], c["fetch.wait.max.ms"]) for c in made] == [("g", 70), ("g-control", 900)]
    made.clear()
    Cluster.of(load(path, bootstrap="127.0.0.1:1")).consumer("g")
    assert made[0]["fetch.wait.max.ms"] == 20  # the default
    made.clear()
    monkeypatch.setenv("STREAMJOIN_KAFKA__FETCH_WAIT_MAX_MS", "35")
    overridden = Cluster.of(load(path, bootstrap="127.0.0.1:1", consumers={"fetch_wait_ms": 70}))
    overridden.consumer("g")
    overridden.control_consumer("g-control")
    assert [c["fetch.wait.max.ms"] for c in made] == ["35", 200]
    with pytest.raises(SettingsError, match="fetch_wait_ms"):
        load(path, bootstrap="127.0.0.1:1", consumers={"fetch_wait_ms": 0})
