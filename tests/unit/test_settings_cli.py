"""Bad job files and flags fail fast with exit code 2 and name what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from streamjoin.cli import app
from streamjoin.job_files import default_job_file
from streamjoin.settings import SettingsError, load

runner = CliRunner()


def _job(tmp_path: Path, mutate) -> Path:  # type: ignore[no-untyped-def]
    data = yaml.safe_load(default_job_file().read_text())
    mutate(data)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_default_job_loads() -> None:
    job = load(default_job_file())
    assert job.partitions == 60 and [s.name for s in job.streams] == ["r", "s"]
    assert job.input_topics == ["equijoin.r", "equijoin.s"]


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["streams"][0]["window"].update(rows=5), "streams.0.window"),
    (lambda d: d["streams"][1].update(time_field="nope"), "streams.1"),
    (lambda d: d.update(partitions=0), "partitions"),
    (lambda d: d["workload"].update(domain=1000), "workload.domain"),
    (lambda d: d["worker"].update(batch_ms="soon"), "worker.batch_ms"),
    (lambda d: d.update(colour="blue"), "colour"),
    (lambda d: d.setdefault("join", {}).update(max_future_ms=-1), "join.max_future_ms"),
    (lambda d: d.setdefault("join", {}).update(max_read_ahead_ms=-5), "join.max_read_ahead_ms"),
    (lambda d: d["worker"].update(batch_ms=100, min_batch_ms=150), "worker.min_batch_ms"),
    (lambda d: d.update(faults={"crash_at": ["w0:nope"]}), "faults.crash_at"),
    (lambda d: d.update(faults={"crash_at": ["coordinator:sender-committed"]}), "faults.crash_at"),
])
def test_bad_job_file_exits_2_naming_the_field(tmp_path: Path, mutate, field: str) -> None:
    path = _job(tmp_path, mutate)
    result = runner.invoke(app, ["topics", "check", "--job", str(path), "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert field in result.output


def test_missing_job_file_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["status", "--job", str(tmp_path / "none.yaml"), "--bootstrap", "x:1"])
    assert result.exit_code == 2
    assert "does not exist" in result.output


def test_bad_flag_exits_2() -> None:
    result = runner.invoke(app, ["demo", "--workers", "0"])
    assert result.exit_code == 2
    assert "--workers" in result.output


def test_no_bootstrap_exits_2_and_says_how(monkeypatch) -> None:
    monkeypatch.delenv("STREAMJOIN_BOOTSTRAP", raising=False)
    result = runner.invoke(app, ["topics", "check"])
    assert result.exit_code == 2
    assert "--bootstrap" in result.output


def test_environment_overrides_file_and_flags_override_environment(monkeypatch) -> None:
    monkeypatch.setenv("STREAMJOIN_WORKER__BATCH_MS", "123")
    monkeypatch.setenv("STREAMJOIN_PARTITIONS", "12")
    job = load(default_job_file(), partitions=7)
    assert job.worker.batch_ms == 123  # env over file
    assert job.worker.state_dir == Path("./out/state")  # rest of the section kept
    assert job.partitions == 7  # flag over env


def test_every_section_of_the_job_file_can_be_set_from_the_environment(monkeypatch) -> None:
    """A section missing from the environment reader is silently ignored there (splitjoin was)."""
    from pydantic import BaseModel

    from streamjoin.settings import JobSettings
    from streamjoin.settings.loading import _EnvOnly

    sections = {name for name, field in JobSettings.model_fields.items()
                if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)}
    assert "splitjoin" in sections and sections <= set(_EnvOnly.model_fields)
    monkeypatch.setenv("STREAMJOIN_SPLITJOIN__PUNCTUATE_EVERY", "16")
    assert load(default_job_file()).splitjoin.punctuate_every == 16


def test_bad_environment_value_is_a_settings_error(monkeypatch) -> None:
    monkeypatch.setenv("STREAMJOIN_WORKER__BATCH_MS", "-5")
    with pytest.raises(SettingsError, match="worker.batch_ms"):
        load(default_job_file())


def _ring_job(tmp_path: Path, **change: object) -> Path:
    data = yaml.safe_load(Path("streamjoin/jobs/band3.yaml").read_text())
    for section, value in change.items():
        data[section] = data.get(section, {}) | value  # type: ignore[operator]
    path = tmp_path / "ring.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("change, words", [
    ({"ring": {"nodes": 0}}, "ring.nodes=0 is impossible"),
    ({"ring": {"nodes": 9, "max_nodes": 4}}, "ring.nodes=9 is impossible"),
    ({"join": {"predicate": [{"left": "r.x", "right": "s.a", "udf": "nope"}]}}, "unknown UDF 'nope'"),
    ({"join": {"predicate": [{"left": "r.x", "right": "s.zz", "within": 1}]}}, "s.zz names no field"),
])
def test_bad_ring_job_exits_2(tmp_path: Path, change: dict, words: str) -> None:
    result = runner.invoke(app, ["worker", "--worker-id", "w0", "--job", str(_ring_job(tmp_path, **change)),
                                 "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert words in result.output


def test_unimportable_udf_exits_2_at_worker_start(tmp_path: Path) -> None:
    path = _ring_job(tmp_path, join={"udfs": {"f": "no_such_module:f"},
                                     "predicate": [{"left": "r.x", "right": "s.a", "udf": "f"}]})
    result = runner.invoke(app, ["worker", "--worker-id", "w0", "--job", str(path), "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert "cannot import 'no_such_module:f'" in result.output


def test_coordinator_defaults_are_the_papers() -> None:
    c = load(default_job_file()).coordinator
    assert c.placement == "sticky"  # groups move only when asked (move, drain) or when a worker dies
    assert (c.buffer_bytes, c.reorg_epoch_ms) == (1 << 20, 20_000)  # the cluster join paper, VI-A, Table 2
    assert (c.supplier_occupancy, c.consumer_occupancy, c.scale_lambda) == (0.5, 0.01, 1.0)  # Table 2, V-A
    assert c.yield_group == "random"  # the cluster join paper, IV-C
    assert (c.memory_balance_theta, c.memory_balance_interval_ms) == (0.8, 45_000)  # the spill paper, 5.1-5.2


@pytest.mark.parametrize("change, field", [
    ({"placement": "elastic"}, "coordinator.placement"),
    ({"buffer_bytes": 0}, "coordinator.buffer_bytes"),
    ({"reorg_epoch_ms": -1}, "coordinator.reorg_epoch_ms"),
    ({"reorg_epoch_ms": 500}, "coordinator.reorg_epoch_ms"),  # shorter than worker.heartbeat_ms (1000)
    ({"supplier_occupancy": 1.5}, "coordinator.supplier_occupancy"),
    ({"consumer_occupancy": -0.1}, "coordinator.consumer_occupancy"),
    ({"consumer_occupancy": 0.6}, "coordinator.consumer_occupancy"),  # not below supplier_occupancy 0.5
    ({"yield_group": "lightest"}, "coordinator.yield_group"),
    ({"scale_lambda": 0}, "coordinator.scale_lambda"),
    ({"scale_cooldown_ms": -5}, "coordinator.scale_cooldown_ms"),
    ({"memory_balance_theta": 1.2}, "coordinator.memory_balance_theta"),
    ({"memory_balance_interval_ms": "often"}, "coordinator.memory_balance_interval_ms"),
])
def test_bad_coordinator_setting_is_a_settings_error_naming_it(tmp_path: Path, change: dict, field: str) -> None:
    path = _job(tmp_path, lambda d: d["coordinator"].update(change))
    with pytest.raises(SettingsError, match=field):
        load(path)
    result = runner.invoke(app, ["rebalance", "--dry-run", "--job", str(path), "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2 and field in result.output, result.output


@pytest.mark.parametrize("change, field", [
    ({"worker_timeout_ms": 1000}, "coordinator.worker_timeout_ms"),  # below heartbeat_timeout_ms
    ({"failover": "maybe"}, "coordinator.failover"),
])
def test_bad_failover_setting_is_a_settings_error_naming_it(tmp_path: Path, change: dict, field: str) -> None:
    with pytest.raises(SettingsError, match=field):
        load(_job(tmp_path, lambda d: d["coordinator"].update(change)))


@pytest.mark.parametrize("args, says", [
    (["move", "60", "--to", "w1"], "GROUP must be in 0..59"),
    (["move", "3", "--to", "w1", "--job", "streamjoin/jobs/band3.yaml"], "needs join.mode: hash"),
    (["drain", "w1", "--job", "streamjoin/jobs/band3.yaml"], "needs join.mode: hash"),
])
def test_move_and_drain_refuse_what_cannot_move_with_exit_2(args: list[str], says: str) -> None:
    result = runner.invoke(app, [*args, "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2 and says in " ".join(result.output.split()), result.output


def test_rebalance_without_dry_run_exits_2_naming_the_migration_protocol() -> None:
    result = runner.invoke(app, ["rebalance", "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2
    assert "streamjoin move" in result.output and "--dry-run" in result.output


def test_rebalance_of_a_ring_job_exits_2() -> None:
    result = runner.invoke(app, ["rebalance", "--dry-run", "--job", "streamjoin/jobs/band3.yaml",
                                 "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2 and "join.mode: hash" in result.output


def _third_stream(data: dict) -> None:
    data["streams"].append(dict(data["streams"][0], name="u", topic=None))


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d.setdefault("join", {}).update(type="left", mode="splitjoin"), "join.type left needs join.mode hash"),
    (lambda d: (d.setdefault("join", {}).update(type="anti"), _third_stream(d)), "join.type anti joins two streams"),
    (lambda d: (d.setdefault("join", {}).update(type="full"),
                d.setdefault("worker", {}).setdefault("spill", {}).update(mode="deferred")),
     "join.type full needs worker.spill.mode probe"),
    (lambda d: d.setdefault("join", {}).update(type="outer"), "join.type"),
])
def test_join_types_hash_mode_cannot_decide_exit_2_saying_why(tmp_path: Path, mutate, words: str) -> None:
    result = runner.invoke(app, ["worker", "--worker-id", "w0", "--job", str(_job(tmp_path, mutate)),
                                 "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert words in result.output


def test_ring_job_refuses_outer_join_naming_why(tmp_path: Path) -> None:
    result = runner.invoke(app, ["worker", "--worker-id", "w0", "--job",
                                 str(_ring_job(tmp_path, join={"type": "left", "mode": "ring"})),
                                 "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert "join.type left needs join.mode hash" in result.output and "cannot be proven exactly" in result.output



def _asof(data: dict, **join: object) -> None:
    """The default job as an as-of join of r with the table s (no windows)."""
    for s in data["streams"]:
        s.pop("window", None)
    data.setdefault("join", {}).update({"table": "s", **join})


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d["streams"][1].pop("window"), "streams.1.window: every stream of a window join needs a window"),
    (lambda d: (_asof(d), d["streams"][0].update(window={"range_ms": 5})), "streams.0.window: an as-of join has no"),
    (lambda d: _asof(d, table="t"), "join.table 't' names no stream"),
    (lambda d: _asof(d, type="full"), "an as-of join is inner or left"),
    (lambda d: (_asof(d), _third_stream(d)), "joins one stream with one table"),
    (lambda d: _asof(d, idle_timeout_ms=1000), "must be unset for an as-of join"),
])
def test_asof_jobs_that_cannot_run_exit_2_saying_why(tmp_path: Path, mutate, words: str) -> None:
    result = runner.invoke(app, ["worker", "--worker-id", "w0", "--job", str(_job(tmp_path, mutate)),
                                 "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split())


def test_an_asof_job_loads_with_its_table_and_no_windows(tmp_path: Path) -> None:
    job = load(_job(tmp_path, lambda d: _asof(d, type="left")))
    assert job.table_index == 1 and all(s.window is None for s in job.streams) and job.longest_time_window_ms == 0
