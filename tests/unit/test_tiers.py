"""Every test lands in exactly one tier (tests/conftest.py), the tier its marks and folder say."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import uses_module_fixture, tier_of


@dataclass
class FakeItem:
    path: Path
    marks: tuple[str, ...] = ()
    fixturenames: tuple[str, ...] = field(default=())

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.marks else None


UNIT, INTEGRATION = Path("tests/unit/test_x.py"), Path("tests/integration/test_x.py")


@pytest.mark.parametrize("item, tier", [
    (FakeItem(UNIT), "unit"),
    (FakeItem(INTEGRATION), "integration"),
    (FakeItem(UNIT, ("integration",)), "integration"),
    (FakeItem(UNIT, fixturenames=("tmp_path", "spark")), "spark"),
    (FakeItem(INTEGRATION, ("spark", "integration")), "spark"),
    (FakeItem(INTEGRATION, ("bench", "spark", "integration")), "bench"),
    (FakeItem(UNIT, ("bench",)), "bench"),
    (FakeItem(UNIT, ("fuzz",)), "fuzz"),
])
def test_a_test_takes_the_most_expensive_tier_its_marks_and_folder_give(item: FakeItem, tier: str) -> None:
    assert tier_of(item) == tier  # type: ignore[arg-type]


def test_this_run_marked_each_test_with_its_tier(request: pytest.FixtureRequest) -> None:
    for item in request.session.items:
        assert item.get_closest_marker(tier_of(item)) is not None, item.nodeid


@pytest.fixture(scope="module")
def set_up_once() -> str:
    """A module-scoped fixture of this module's own, so the check below always has a test to look at."""
    return "set up once"


def test_tests_sharing_a_module_fixture_are_scheduled_together(request: pytest.FixtureRequest,
                                                                set_up_once: str) -> None:
    """Under pytest-xdist a module-scoped fixture runs once per worker process: the tests using
    one carry their module's xdist_group (or the Spark or bench one), so it runs once per run."""
    shared = [item for item in request.session.items if uses_module_fixture(item)]
    assert request.node in shared
    for item in shared:
        groups = [m.args[0] for m in item.iter_markers("xdist_group")]
        assert groups and groups[0] in ("spark", "bench", f"module:{item.module.__name__}"), (item.nodeid, groups)
