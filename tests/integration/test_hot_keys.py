"""Hot keys through the real parts: two hash workers count their input's keys, report them in
their heartbeats, and the coordinator finds the key that carries 40% of the input hot: it logs
it, meters it, and `streamjoin status` shows it with the group and the worker that hold it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from streamjoin.schemas.join_keys import key_bytes
from streamjoin.services.coordinator.status import snapshot
from streamjoin.services.io import kafka
from streamjoin.topology.partitioner import partition_for
from tests.integration.conftest import make_job
from tests.integration.fleet_harness import wait_metric, wait_until
from tests.integration.kafka_harness import Row, produce

pytestmark = pytest.mark.integration

HOT = 7


def test_a_key_carrying_forty_percent_of_the_input_is_found_hot(broker, fleet_for, tmp_path: Path) -> None:
    job = make_job(broker.bootstrap, tmp_path, [{"range_ms": 50}, {"range_ms": 50}], workers=2, partitions=8,
                   coordinator={"hot_key_min_tuples": 500})
    fleet = fleet_for(job, 2)
    rnd = random.Random(5)
    rows = [Row(rnd.choice("rs"), HOT if rnd.random() < 0.4 else rnd.randrange(100, 400), 10_000 + i)
            for i in range(3000)]
    produce(job, broker.bootstrap, rows)
    cluster = kafka.Cluster(broker.bootstrap)

    def settled() -> dict | None:
        # Shares are of what the workers' latest heartbeats counted: judge them once both count it all.
        s = snapshot(job, cluster)
        return s if sum(w["keys_counted"] or 0 for w in s["workers"]) == len(rows) else None

    snap = wait_until("both workers counted every tuple", settled, timeout=90, fleet=fleet)
    (hot,) = snap["hot_keys"]
    group = partition_for(key_bytes(HOT), job.partitions)
    owner = next(w["worker"] for w in snap["workers"] if group in w["held_groups"])
    true_share = sum(r.key == HOT for r in rows) / len(rows)
    assert (hot["key"], hot["group"], hot["worker"]) == (str(HOT), group, owner)
    # An estimate never overstates, and with 64 counters understates by under 1/65 of the input
    # (status rounds shares to four places).
    assert true_share - 1 / 65 <= hot["share"] <= true_share + 5e-5

    assert wait_metric(fleet.metrics_ports["coordinator"], "streamjoin_coordinator_hot_keys", 1, timeout=30) == 1
    logged = [json.loads(line) for line in (fleet.log_dir / "coordinator.log").read_text().splitlines()
              if '"hot key"' in line]
    assert [(e["key"], e["group"]) for e in logged] == [(str(HOT), group)]
    shown = subprocess.run([sys.executable, "-m", "streamjoin.cli", "status", "--job", str(fleet.job_file),
                            "--bootstrap", broker.bootstrap], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert f"hot key '{HOT}' (group {group}, on {owner})" in shown.stdout
