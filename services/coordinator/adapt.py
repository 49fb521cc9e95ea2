"""The adaptive placement policy, pure (no Kafka, no clock): what the coordinator would do at
the end of one reorganisation epoch, and why.

Two papers, one decision per epoch (docs/papers.md):

- the cluster join paper's load balancing and degree of declustering
  (load_balance.py);
- the spill paper's memory balancing and disk adaptations (memory_balance.py),
  never beside another adaptation (its section 6, restriction 1: one adaptation at a time).

Load balancing comes first: backlog is the throughput signal, and it runs every epoch. Memory
balancing takes an epoch in which load balancing decides nothing; an active-disk push one in
which neither moves anything. No adaptation starts while one is under way (`History.in_flight`).
Call `plan_epoch` once per reorganisation epoch (`coordinator.reorg_epoch_ms`): "one group per
supplier" is per call.

Only alive workers take part: a dead worker is neither a source nor a target (its groups are
failover's business). Active workers hold groups; standbys heartbeat and hold nothing, and are
the reserve a scale-out draws on (the Helm chart's replica count is the maximum).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from streamjoin.services.coordinator.epoch import History, Plan, WorkerObservation
from streamjoin.services.coordinator.load_balance import classify, occupancy, plan_load
from streamjoin.services.coordinator.memory_balance import plan_memory, plan_push
from streamjoin.settings import CoordinatorSpec, SpillSpec

# worker.spill.push_fraction's default, for callers that plan without a job's worker section.
DEFAULT_PUSH_FRACTION: float = SpillSpec.model_fields["push_fraction"].default


def plan_epoch(observations: Sequence[WorkerObservation], settings: CoordinatorSpec, now_ms: int,
               history: History, rng: random.Random, push_fraction: float = DEFAULT_PUSH_FRACTION) -> Plan:
    """The adaptation to start at the end of this reorganisation epoch.

    observations: every known worker, dead ones included; settings: the job's coordinator
    section; now_ms: the epoch's end on the caller's clock (cool-downs are measured on it);
    history: the previous adaptations; rng: the only source of randomness (which group a
    supplier yields), injected so a plan can be replayed; push_fraction: the job's
    worker.spill.push_fraction, the share of a worker's memory an active-disk push order asks
    for at most."""
    active = sorted((o for o in observations if o.alive and o.role == "active"), key=lambda o: o.worker)
    occ = {o.worker: occupancy(o.backlog_samples, settings.buffer_bytes) for o in active}
    classes = {w: classify(x, settings) for w, x in occ.items()}
    base = Plan(now_ms, occ, classes)
    if history.in_flight:
        return replace(base, notes=("an adaptation is still under way: no other starts beside it "
                                    "(spill paper, section 6)",))
    standbys = sorted(o.worker for o in observations if o.alive and o.role == "standby")
    load = plan_load(base, active, standbys, settings, history, rng)
    if load.adaptation is not None:
        return load
    memory, settled = plan_memory(load, active, settings, history)
    if memory.moves or not settled or settings.disk_adaptation != "active-disk":
        return memory
    return plan_push(memory, active, settings, history, push_fraction)
