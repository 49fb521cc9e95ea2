"""services/workloads.py: deterministic batches of the right columns and types, the
arrival process, and each kind's distributions (images: the asked-for selectivity; productivity:
keys in their partition group, same-key partners per tuple growing with the group's join ratio;
zipf: Zipf key frequencies and one key's share on top)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from streamjoin.cli import app
from streamjoin.engine.udfs import pixel_similarity
from streamjoin.schemas.join_keys import key_bytes, key_text
from streamjoin.services.spark.sources import _check_formats
from streamjoin.services.workloads import (generate, group_domains, group_key_field, group_keys, json_lengths,
                                           json_values, poisson_times, sample, scenes, zipf_keys, zipf_shares)
from streamjoin.settings import JobSettings, SettingsError, load
from streamjoin.topology.partitioner import partition_for, partitions_for_keys
from tests.profiles import examples

JOBS = ["equijoin", "band", "band3", "images"]
DTYPE_KINDS = {"int": "i", "float": "f", "str": "U", "bool": "b", "bytes": "S"}
T0 = 1_700_000_000_000


def job_of(name: str, **overrides: object) -> JobSettings:
    return load(f"streamjoin/jobs/{name}.yaml", **overrides)


def batch(job: JobSettings, stream: int, seed: int = 3, ms: int = 2000) -> dict[str, np.ndarray]:
    return generate(job, stream, np.random.default_rng([seed, stream, 1]), T0, T0 + ms, 500.0)


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


@pytest.mark.parametrize("name", JOBS)
def test_columns_types_and_arrivals(name: str) -> None:
    job = job_of(name, workload={"pixels": 40})
    for i, spec in enumerate(job.streams):
        cols = batch(job, i)
        assert list(cols) == list(spec.fields)
        assert {f: cols[f].dtype.kind for f in cols} == {f: DTYPE_KINDS[t] for f, t in spec.fields.items()}
        ts = cols[spec.time_field]
        assert len({len(c) for c in cols.values()}) == 1
        assert 800 < len(ts) < 1200, "500/s for 2 s"
        assert np.all(np.diff(ts) >= 0) and T0 <= ts.min() and ts.max() < T0 + 2000


@pytest.mark.parametrize("name", JOBS)
def test_deterministic_per_seed_stream_and_batch(name: str) -> None:
    job = job_of(name, workload={"pixels": 40})
    assert same(batch(job, 0), batch(job, 0))
    assert not same(batch(job, 0), batch(job, 0, seed=4))
    assert not same(batch(job, 0), generate(job, 0, np.random.default_rng([3, 0, 2]), T0, T0 + 2000, 500.0))
    assert same(sample(job, 1, 50, seed=9), sample(job, 1, 50, seed=9))
    assert len(sample(job, 1, 50, seed=9)[job.streams[1].time_field]) == 50


@pytest.mark.parametrize("name", JOBS)
def test_empty_interval(name: str) -> None:
    """The sources' warm-up batch: no tuples, but every column with its type."""
    job = job_of(name, workload={"pixels": 40})
    for i, spec in enumerate(job.streams):
        cols = generate(job, i, np.random.default_rng(0), T0, T0, 100.0)
        assert {f: (cols[f].dtype.kind, len(cols[f])) for f in cols} == {
            f: (DTYPE_KINDS[t], 0) for f, t in spec.fields.items()}


def test_poisson_rate() -> None:
    times = poisson_times(np.random.default_rng(1), 1000.0, 0, 60_000)
    assert abs(len(times) - 60_000) < 5 * np.sqrt(60_000)
    assert np.all((times >= 0) & (times < 60_000))


def test_equijoin_keys_and_padding() -> None:
    job = job_of("equijoin", workload={"domain": 1024, "tuple_bytes": 64})
    spec = job.streams[0]
    cols = batch(job, 0)
    assert np.all((cols["k"] >= 0) & (cols["k"] < 1024))
    assert np.bincount(cols["k"], minlength=1024)[0] > 5 * len(cols["k"]) / 1024, "b-model: skewed to low keys"
    assert np.all(json_lengths(spec, cols) == 64)  # the pad brings every record to tuple_bytes


@pytest.mark.parametrize("name", ["equijoin", "band", "band3"])
def test_json_values_parse_back_to_the_columns_at_the_measured_lengths(name: str) -> None:
    job = job_of(name)
    for i, spec in enumerate(job.streams):
        cols = batch(job, i)
        values = json_values(spec, cols)
        assert [len(v) for v in values.tolist()] == json_lengths(spec, cols).tolist()
        parsed = [json.loads(v) for v in values.tolist()]
        for field in spec.fields:
            assert [row[field] for row in parsed] == cols[field].tolist(), field


def test_band_values() -> None:
    job = job_of("band", workload={"value_max": 50})
    r, s = batch(job, 0), batch(job, 1)
    for ints in (r["x"], s["a"]):
        assert ints.min() == 1 and ints.max() == 50
    for floats in (r["y"], s["b"], s["c"]):
        assert floats.min() >= 1 and floats.max() <= 50
    assert r["z"].dtype == np.dtype("U20") and np.all(np.strings.str_len(r["z"]) == 20)
    assert 0.4 < s["d"].mean() < 0.6


@pytest.mark.parametrize("selectivity", [0.1, 0.25])
def test_image_pairs_match_with_the_workload_selectivity(selectivity: float) -> None:
    job = job_of("images", workload={"pixels": 64, "selectivity": selectivity})
    a, b = sample(job, 0, 300, seed=1)["img"], sample(job, 1, 300, seed=1)["img"]
    assert a.dtype == np.dtype("S192") == b.dtype
    ii, jj = np.divmod(np.arange(len(a) * len(b)), len(b))
    share = pixel_similarity(a[ii], b[jj], threshold=0.9, tolerance=16).mean()
    assert abs(share - 1 / scenes(job)) < 0.03, share


def test_image_ids_run_and_scenes_are_shared() -> None:
    job = job_of("images", workload={"pixels": 16})
    cols = [batch(job, i) for i in range(3)]
    assert all(np.all(np.diff(c["id"]) > 0) for c in cols), "a running id"
    # Every stream draws from the same scenes: images of different streams match too.
    assert pixel_similarity(cols[0]["img"][:1].repeat(len(cols[2]["img"])), cols[2]["img"]).any()


# ---------------------------------------------------------------- productivity (the spill paper's workload)


def productivity_job(partitions: int = 6, key_type: str = "int", **workload: object) -> JobSettings:
    """The spill paper's 3-way join a x b x c on key k, over the equi-join job file's other settings."""
    streams = [{"name": n, "fields": {"k": key_type, "ts": "int", "pad": "str"}, "time_field": "ts",
                "key_fields": ["k"], "window": {"range_ms": 60000}} for n in "abc"]
    return job_of("equijoin", partitions=partitions, streams=streams, workload={"kind": "productivity", **workload})


def groups_of(keys: np.ndarray, key_type: str, partitions: int) -> np.ndarray:
    """Each key's partition group as a producer routes the record (the vectorised partitioner)."""
    return partitions_for_keys(key_text([(keys, key_type)]), partitions)


def assert_in_domains(job: JobSettings, keys: np.ndarray, hashed: np.ndarray) -> None:
    """Every key is one of the first group_domains(job)[g] keys of the pool of the group g it hashes to."""
    domains = group_domains(job)
    pools = group_keys(job.partitions, int(domains.max()))
    for g in np.unique(hashed):
        assert np.isin(keys[hashed == g], pools[g, :domains[g]]).all(), g


@pytest.mark.parametrize("partitions", [1, 7, 60])
def test_productivity_key_pools_hash_to_their_group(partitions: int) -> None:
    pools = group_keys(partitions, 40)
    assert pools.shape == (partitions, 40) and len(np.unique(pools)) == pools.size
    # The scalar reference partitioner, independent of the vectorised one the pools are built with.
    assert all(partition_for(key_bytes(int(k)), partitions) == g for g in range(partitions) for k in pools[g])
    assert group_keys(partitions, 40) is pools, "cached: a batch does not hash again"


@pytest.mark.parametrize("key_type", ["int", "str"])
def test_productivity_keys_land_uniformly_in_their_groups(key_type: str) -> None:
    job = productivity_job(partitions=12, key_type=key_type, tuple_range=6000, join_ratios=[4, 1])
    k = batch(job, 0, ms=20_000)["k"]
    hashed = groups_of(k, key_type, 12)
    assert_in_domains(job, k.astype(np.int64), hashed)
    counts = np.bincount(hashed, minlength=12)
    assert np.all(np.abs(counts - len(k) / 12) < 0.15 * len(k) / 12), counts


def test_productivity_domains_follow_the_ratios() -> None:
    job = productivity_job(partitions=6, tuple_range=12_000, join_ratios=[4, 2, 1])
    assert group_domains(job).tolist() == [500, 1000, 2000] * 2
    assert group_domains(productivity_job(partitions=64, tuple_range=10, join_ratios=[3])).tolist() == [1] * 64


def test_productivity_deterministic_per_rng_and_sampled() -> None:
    job = productivity_job()
    assert same(batch(job, 0), batch(job, 0))
    assert not same(batch(job, 0), batch(job, 0, seed=4))
    cols = sample(job, 2, 300, seed=5)
    assert same(cols, sample(job, 2, 300, seed=5))
    assert list(cols) == ["k", "ts", "pad"] and cols["ts"].tolist() == list(range(300))
    assert_in_domains(job, cols["k"], groups_of(cols["k"], "int", job.partitions))
    assert np.all(json_lengths(job.streams[2], cols) == job.workload.tuple_bytes)


@pytest.mark.parametrize("ranges", [1, 2])
def test_productivity_partners_per_tuple_grow_with_the_join_ratio(ranges: int) -> None:
    """Within w ranges, a tuple of group ratio j meets about w * j same-key tuples of each other
    stream, so about (w * j)^2 3-way results (the paper: ratio 2 gives 4, then 16)."""
    rate, tuple_range = 2000.0, 12_000
    job = productivity_job(partitions=6, tuple_range=tuple_range, join_ratios=[4, 1])
    span = int(ranges * tuple_range / rate * 1000)  # one range = tuple_range / rate seconds
    # Generated per one-second batch, as the Spark sources do: the ratio must not need state across batches.
    streams = [np.concatenate([generate(job, i, np.random.default_rng([11, i, t]), T0 + t, T0 + t + 1000, rate)["k"]
                               for t in range(0, span, 1000)]) for i in range(3)]
    a, others = streams[0], streams[1:]
    partners = []
    for keys in others:
        values, counts = np.unique(keys, return_counts=True)
        at = np.minimum(np.searchsorted(values, a), len(values) - 1)
        partners.append(np.where(values[at] == a, counts[at], 0))
    ratio = np.array([4.0, 1.0])[groups_of(a, "int", 6) % 2]
    for j in (4.0, 1.0):
        mine = ratio == j
        for p in partners:
            assert abs(p[mine].mean() - ranges * j) < 0.1 * ranges * j, (j, p[mine].mean())
        results = (partners[0] * partners[1])[mine].mean()
        assert abs(results - (ranges * j) ** 2) < 0.15 * (ranges * j) ** 2, (j, results)


@pytest.mark.parametrize("workload, field", [
    ({"join_ratios": []}, "workload.join_ratios"),
    ({"join_ratios": [4, 0]}, "workload.join_ratios"),
    ({"join_ratios": [-1.0]}, "workload.join_ratios"),
    ({"join_ratios": [float("nan")]}, "workload.join_ratios"),
    ({"join_ratios": [float("inf")]}, "workload.join_ratios"),
    ({"tuple_range": 0}, "workload.tuple_range"),
])
def test_productivity_bad_settings_name_the_field(tmp_path: Path, workload: dict, field: str) -> None:
    with pytest.raises(SettingsError, match=field):
        productivity_job(**workload)
    data = yaml.safe_load(Path("streamjoin/jobs/equijoin.yaml").read_text())
    data["workload"].update(kind="productivity", **workload)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["topics", "check", "--job", str(tmp_path / "job.yaml"),
                                      "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2 and field in result.output, result.output


@pytest.mark.parametrize("update", [{"key_fields": []}, {"key_fields": ["k", "ts"]},
                                    {"fields": {"k": "bool", "ts": "int", "pad": "str"}}])
def test_productivity_needs_one_int_or_str_key_field(update: dict) -> None:
    """Checked by the generator and, before Spark starts, by the sources job."""
    job = productivity_job()
    spec = job.streams[1].model_copy(update=update)
    with pytest.raises(ValueError, match="stream b"):
        group_key_field(spec)
    with pytest.raises(ValueError, match="stream b"):
        _check_formats(job.model_copy(update={"streams": [job.streams[0], spec, job.streams[2]]}))


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(1, 64), st.integers(1, 20_000), st.lists(st.floats(0.5, 8.0), min_size=1, max_size=4),
       st.integers(0, 2**32 - 1))
def test_productivity_fuzz_every_key_lands_in_its_group(partitions: int, tuple_range: int, ratios: list[float],
                                                    seed: int) -> None:
    job = productivity_job(partitions=partitions, tuple_range=tuple_range, join_ratios=ratios)
    k = generate(job, 0, np.random.default_rng(seed), T0, T0 + 500, 1000.0)["k"]
    assert_in_domains(job, k, groups_of(k, "int", partitions))


# ---------------------------------------------------------------- zipf


@pytest.mark.parametrize("exponent, top", [(0.0, 0.4), (0.8, 0.0), (1.5, 0.0), (1.0, 0.25)])
def test_zipf_keys_follow_their_shares(exponent: float, top: float) -> None:
    n, domain = 200_000, 512
    keys = zipf_keys(np.random.default_rng(5), n, exponent, domain, top)
    assert keys.dtype == np.int64 and keys.min() >= 0 and keys.max() < domain
    shares = zipf_shares(domain, exponent, top)
    assert np.isclose(shares.sum(), 1.0) and np.all(np.diff(shares[1:]) <= 1e-15), "key 0 first, then falling"
    seen = np.bincount(keys, minlength=domain) / n
    # Each of the ten most frequent keys within five binomial standard deviations of its share.
    sd = np.sqrt(shares[:10] * (1 - shares[:10]) / n)
    assert np.all(np.abs(seen[:10] - shares[:10]) < 5 * sd + 1e-9), (seen[:10], shares[:10])
    assert seen[0] >= top


def test_zipf_shares_of_the_sweep() -> None:
    """The most frequent key's share at the bench's exponents over 4,096 keys, and one key on top."""
    assert [round(float(zipf_shares(4096, a)[0]), 3) for a in (0.8, 1.0, 1.2, 1.5)] == [0.046, 0.112, 0.215, 0.387]
    assert zipf_shares(4096, 0.0, 0.4)[0] == pytest.approx(0.4 + 0.6 / 4096)


def test_zipf_kind_generates_equijoin_tuples_with_zipf_keys() -> None:
    job = job_of("equijoin", workload={"kind": "zipf", "domain": 1024, "zipf_exponent": 0.0, "top_key_share": 0.5})
    cols = batch(job, 0, ms=4000)
    assert np.all((cols["k"] >= 0) & (cols["k"] < 1024))
    assert 0.45 < np.mean(cols["k"] == 0) < 0.55
    assert np.all(json_lengths(job.streams[0], cols) == job.workload.tuple_bytes)
    assert same(batch(job, 0), batch(job, 0)) and not same(batch(job, 0), batch(job, 0, seed=4))


def test_zipf_kind_keys_the_backlog_too() -> None:
    from streamjoin.bench.backlog import draw

    job = job_of("equijoin", partitions=8, workload={"kind": "zipf", "domain": 256, "top_key_share": 0.3})
    chunk = draw(job, 0, 0, T0, T0 + 4000, 1000.0)
    assert abs(np.mean(chunk.key == 0) - zipf_shares(256, job.workload.zipf_exponent, 0.3)[0]) < 0.05
    assert np.all(chunk.partition == partitions_for_keys(key_text([(chunk.key, "int")]), 8))


@pytest.mark.parametrize("workload, field", [
    ({"zipf_exponent": -0.5}, "workload.zipf_exponent"),
    ({"zipf_exponent": 4.5}, "workload.zipf_exponent"),
    ({"zipf_exponent": float("nan")}, "workload.zipf_exponent"),
    ({"top_key_share": 1.0}, "workload.top_key_share"),
    ({"top_key_share": -0.1}, "workload.top_key_share"),
])
def test_zipf_bad_settings_name_the_field(workload: dict, field: str) -> None:
    with pytest.raises(SettingsError, match=field):
        job_of("equijoin", workload={"kind": "zipf", **workload})
