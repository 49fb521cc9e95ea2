"""services/workloads.py: deterministic batches of the right columns and types, the
arrival process, and each kind's distributions (images: the asked-for selectivity)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from streamjoin.engine.udfs import pixel_similarity
from streamjoin.services.workloads import generate, json_lengths, json_values, poisson_times, sample, scenes
from streamjoin.settings import JobSettings, load

JOBS = ["seed000", "band", "band3", "images"]
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
    job = job_of("seed000", workload={"domain": 1024, "tuple_bytes": 64})
    spec = job.streams[0]
    cols = batch(job, 0)
    assert np.all((cols["k"] >= 0) & (cols["k"] < 1024))
    assert np.bincount(cols["k"], minlength=1024)[0] > 5 * len(cols["k"]) / 1024, "b-model: skewed to low keys"
    assert np.all(json_lengths(spec, cols) == 64)  # the pad brings every record to tuple_bytes


@pytest.mark.parametrize("name", ["seed000", "band", "band3"])
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
