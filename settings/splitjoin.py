"""The job file's `splitjoin:` section: SplitJoin's cores, the most a scale may ask for, its
punctuation precision and release interval (splitjoin mode)."""

from __future__ import annotations

from pydantic import Field

from streamjoin.settings.base import StrictModel


class SplitJoinSpec(StrictModel):
    """SplitJoin (the broadcast join of its paper): every core reads every tuple, stores each stream's every k-th tuple
    (per-stream sequence number mod k = its position) and probes every tuple against what it
    stores; the merger puts the cores' results in input order by their punctuations."""

    cores: int = Field(default=2, ge=1, le=64, description="k at start; `streamjoin splitjoin scale` changes it")
    max_cores: int = Field(
        default=16, ge=1, le=64,
        description="partitions of the core-output and core-changelog topics: the most cores a scale may ask for")
    punctuate_every: int = Field(
        default=1, ge=0,
        description="punctuation precision: 1 = after every input tuple, n = every n tuples, 0 = none (unordered)")
    batch_ms: int = Field(default=50, gt=0, description="how often a core releases what the input order lets go")
