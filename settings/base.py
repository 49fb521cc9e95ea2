"""The base of every job-file section's model: strict (an unknown key is an error naming it,
not a silently ignored typo) and frozen (settings are read, never changed, once loaded)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A job-file section or part of one: unknown keys refused, instances immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)
