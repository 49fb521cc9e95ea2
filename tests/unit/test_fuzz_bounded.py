"""A bounded fuzzing run in CI: each decoder's atheris target, and the query parser's,
for FUZZ_SECONDS (scaled by the Hypothesis profile, as the property tests are), in a subprocess (libFuzzer owns the process), seeded from the kept
corpus. Longer runs: tests/fuzz/fuzz.py by hand."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.profiles import SCALE

atheris = pytest.importorskip("atheris")

ROOT = Path(__file__).resolve().parents[2]
FUZZ_SECONDS = 2 * SCALE  # per target: 2 s under the `ci` profile (the six in about 25 s with start-up), 20 s `deep`


@pytest.mark.fuzz
@pytest.mark.timeout(FUZZ_SECONDS + 60)
@pytest.mark.parametrize("decoder", ["json", "json-fields", "avro", "blocks", "cql", "split"])
def test_fuzz_target_runs_clean_for_a_bounded_time(decoder: str, tmp_path: Path) -> None:
    """No crash, no assertion failure, within -max_total_time; new inputs go to tmp_path, not the repo."""
    cmd = [sys.executable, str(ROOT / "tests" / "fuzz" / "fuzz.py"), decoder, f"-max_total_time={FUZZ_SECONDS}",
           "-rss_limit_mb=3072", "-timeout=20", "-max_len=65536", f"-artifact_prefix={tmp_path}/",
           str(tmp_path), str(ROOT / "tests" / "fuzz" / "corpus" / decoder)]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=FUZZ_SECONDS + 50)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Done" in run.stderr and not list(tmp_path.glob("crash-*"))
