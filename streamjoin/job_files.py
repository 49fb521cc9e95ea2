"""The job files shipped inside the package (streamjoin/jobs/*.yaml): where each one is
on disk, for the CLI's default job and for the benchmarks' workloads."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def job_file(name: str) -> Path:
    """The shipped job file `name` (e.g. "band.yaml"), wherever the package is installed."""
    return Path(str(resources.files("streamjoin") / "jobs" / name))


def default_job_file() -> Path:
    """The job every command runs without --job: the equi-join demo job."""
    return job_file("equijoin.yaml")
