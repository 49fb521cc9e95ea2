"""The engine's kernels (engine/jit.py) where numba has, and has not, a writable cache directory:
a read-only root filesystem (the Helm chart's pods) must not stop a service at import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from numba.core import caching

from streamjoin.engine import jit

ENGINE = Path(jit.__file__).parent
# Imports every kernel module and runs one kernel: what a service does on its first batch.
_IMPORT_AND_RUN = textwrap.dedent("""
    import numpy as np
    import streamjoin.engine.json_scan, streamjoin.engine.row_kernels, streamjoin.engine.text_kernels
    from streamjoin.engine.hash_kernels import murmur2_flat
    print(int(murmur2_flat(np.frombuffer(b"21", np.uint8), np.array([0, 2], np.uint64))[0]))
""")
# Kafka's murmur2 of b"21" as unsigned, what _IMPORT_AND_RUN prints (Java: Utils.murmur2("21".getBytes())).
_MURMUR2_21 = -973932308 & 0xFFFFFFFF


def _add_one(x: int) -> int:
    return x + 1


def test_a_kernel_caches_where_a_directory_is_writable():
    compiled = jit.kernel(_add_one)
    assert compiled(41) == 42
    assert isinstance(compiled._cache, caching.FunctionCache)


def test_a_kernel_compiles_per_process_where_no_directory_is_writable(monkeypatch):
    def read_only(locator: caching._CacheLocator) -> None:
        raise OSError(30, "Read-only file system", locator.get_cache_path())

    monkeypatch.setattr(caching._CacheLocator, "ensure_cache_path", read_only)
    monkeypatch.setattr(jit, "_warned", set())
    with pytest.warns(RuntimeWarning, match="NUMBA_CACHE_DIR"):
        compiled = jit.kernel(_add_one)
    assert compiled(41) == 42
    assert isinstance(compiled._cache, caching.NullCache)


def _can_mount_read_only(scratch: Path) -> bool:
    """Whether this machine lets an unprivileged-looking test bind a directory read-only in a
    private mount namespace (unshare -m)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind -o ro {scratch} {scratch}"],
                           capture_output=True)
    return probe.returncode == 0


def _run_read_only(scratch: Path, cache_dir: Path | None) -> subprocess.CompletedProcess:
    """_IMPORT_AND_RUN with the engine's source directory and HOME read-only, as in a pod whose
    root filesystem is read-only; NUMBA_CACHE_DIR is `cache_dir` (None: unset)."""
    home = scratch / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = str(cache_dir)
    mounts = f"mount --bind -o ro {ENGINE} {ENGINE} && mount --bind -o ro {home} {home}"
    return subprocess.run(["unshare", "-m", "sh", "-c", f'{mounts} && exec "$0" -W always -c "$1"', sys.executable,
                           _IMPORT_AND_RUN], capture_output=True, text=True, timeout=300, env=env)


def test_services_import_on_a_read_only_root_filesystem(tmp_path):
    """Without NUMBA_CACHE_DIR nothing is writable: the kernels compile in the process, with a
    warning naming the setting. With it (the image's /tmp/numba-cache), they are cached there."""
    if not _can_mount_read_only(tmp_path):
        pytest.skip("unshare -m with a read-only bind mount is not permitted here")
    bare = _run_read_only(tmp_path, None)
    assert bare.returncode == 0, bare.stderr
    assert bare.stdout.split() == [str(_MURMUR2_21)]
    assert "set NUMBA_CACHE_DIR" in bare.stderr

    cache = tmp_path / "numba-cache"
    cached = _run_read_only(tmp_path, cache)
    assert cached.returncode == 0, cached.stderr
    assert cached.stdout.split() == [str(_MURMUR2_21)]
    assert "NUMBA_CACHE_DIR" not in cached.stderr
    assert any(path.name.startswith("hash_kernels.murmur2_flat") for path in cache.rglob("*.nbi"))
