"""The collector settings a streaming service runs under (services/collector.py)."""

from __future__ import annotations

import gc
from typing import Iterator

import pytest

from streamjoin.services import collector


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_settle_freezes_what_lives_and_widens_the_young_generation(restored_collector: None) -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    collector.settle()
    assert gc.get_freeze_count() > 1000  # the interpreter's and the imported modules' objects
    assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, *collector.OLDER_THRESHOLDS)


def test_cycles_made_after_settling_are_still_collected(restored_collector: None) -> None:
    collector.settle()

    class Node:
        pass

    node = Node()
    node.self = node  # type: ignore[attr-defined]
    del node
    assert gc.collect() >= 1  # the cycle was found: the collector still runs
