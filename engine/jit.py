"""How the engine compiles its loops: numba's `njit`, without the GIL, its machine code cached
on disk when numba finds a writable place for it, otherwise compiled once per process.

numba chooses a cache directory when a function is decorated (NUMBA_CACHE_DIR, else beside the
source, else the user's cache directory) and raises if none is writable. A container with a
read-only root filesystem (the Helm chart's pods) has none unless NUMBA_CACHE_DIR names one:
without the fallback here every service would fail at import there. The image sets
NUMBA_CACHE_DIR to /tmp/numba-cache, which the chart mounts writable."""

from __future__ import annotations

import warnings
from typing import Callable, TypeVar

import numba

__all__ = ["kernel"]

Function = TypeVar("Function", bound=Callable)
_warned: set[str] = set()  # the source files already warned about, so a module warns once


def kernel(function: Function) -> Function:
    """`function` compiled by numba in nopython mode, releasing the GIL, cached on disk where a
    cache directory is writable (see the module's docstring) and compiled per process where not.

    function: a loop over NumPy arrays and scalars that numba's nopython mode accepts."""
    try:
        return numba.njit(cache=True, nogil=True)(function)
    except RuntimeError as error:
        if "no locator available" not in str(error):
            raise
    source = function.__code__.co_filename
    if source not in _warned:
        _warned.add(source)
        warnings.warn(f"numba finds no writable cache directory for {source}: its kernels compile in "
                      f"every process (set NUMBA_CACHE_DIR to a writable directory)", RuntimeWarning,
                      stacklevel=2)
    return numba.njit(nogil=True)(function)

