"""Loading a job: the YAML job file, overlaid by the environment (`STREAMJOIN_*`, nested with
`__`) and then by CLI flags, validated into a `JobSettings`. A bad file, variable or flag
raises `SettingsError`, whose message names the field and what would fix it; the CLI turns
that into exit code 2."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from streamjoin.settings import kafka as kafka_settings
from streamjoin.settings.job import JobSettings


class SettingsError(ValueError):
    """A configuration problem a user must fix; message says which field and how."""


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _explain(err: ValidationError, origin: str) -> str:
    lines = [f"invalid settings in {origin}:"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  - {where}: {e['msg']}")
    lines.append("fix the named field(s) in the job file, the STREAMJOIN_* variable or the flag")
    return "\n".join(lines)


def load(path: Path | str | None = None, **overrides: Any) -> JobSettings:
    """Read the job file (if any), overlay env, then `overrides` (CLI flags, None = not given)."""
    data: dict[str, Any] = {}
    origin = "defaults"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise SettingsError(f"job file {p} does not exist: pass the path of a YAML job file (example: streamjoin/jobs/equijoin.yaml)")
        try:
            raw = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise SettingsError(f"job file {p} is not valid YAML: {e}") from e
        if not isinstance(raw, dict):
            raise SettingsError(f"job file {p} must hold a mapping at top level, got {type(raw).__name__}")
        data, origin = raw, str(p)
    flags = {k: v for k, v in overrides.items() if v is not None}
    try:
        env_only = _EnvOnly().model_dump(exclude_unset=True)
        merged = _deep_merge(_deep_merge(data, env_only), flags)
        # The kafka: sections overlay per property, never merging one reference into another.
        kafka = kafka_settings.overlay(data.get("kafka"), kafka_settings.from_environment(os.environ),
                                       flags.get("kafka"))
        return JobSettings(**(merged | {"kafka": kafka}))
    except ValidationError as e:
        # from None: the ValidationError's own text would show the input, secrets included.
        raise SettingsError(_explain(e, origin)) from None


class _EnvOnly(BaseSettings):
    """Reads only the environment, so env can be merged beneath CLI flags and above the file."""

    model_config = SettingsConfigDict(env_prefix="STREAMJOIN_", env_nested_delimiter="__", extra="ignore")

    job: str | None = None
    bootstrap: str | None = None
    partitions: int | None = None
    join: dict[str, Any] | None = None
    worker: dict[str, Any] | None = None
    coordinator: dict[str, Any] | None = None
    ring: dict[str, Any] | None = None
    splitjoin: dict[str, Any] | None = None
    workload: dict[str, Any] | None = None
    output: dict[str, Any] | None = None
    faults: dict[str, Any] | None = None
    queries: dict[str, Any] | None = None
    topics: dict[str, Any] | None = None
    transactions: dict[str, Any] | None = None
    consumers: dict[str, Any] | None = None
    # kafka: read by streamjoin.settings.kafka.from_environment, which keeps secrets as {env:} references.
