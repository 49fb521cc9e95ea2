"""The house rules a reader relies on, checked over every module of the package (tests aside):
small modules that say what they own, and names that say what a thing is, in code and in the
CLI's help, rather than which paper or issue it came from (docs/papers.md cites the papers)."""

from __future__ import annotations

import ast
import re

import pytest
from click.testing import CliRunner
from typer.main import get_command

from tests.unit.test_packaging import REPO, module_name, tracked_python_files

pytestmark = pytest.mark.unit

MAX_LINES = 500
NUMBERED = re.compile(r"seed ?00[0-4]|issue [0-9]+", re.IGNORECASE)


def package_modules() -> list:
    return [path for path in tracked_python_files() if module_name(path) is not None]


def test_every_module_is_small_and_says_what_it_owns() -> None:
    big = [f"{p.relative_to(REPO)}: {n} lines" for p in package_modules()
           if (n := len(p.read_text().splitlines())) > MAX_LINES]
    silent = [str(p.relative_to(REPO)) for p in package_modules() if not ast.get_docstring(ast.parse(p.read_text()))]
    assert not big, f"split by concern, under {MAX_LINES} lines: {big}"
    assert not silent, f"a module docstring saying what it owns: {silent}"


def test_code_names_things_not_papers_or_issues() -> None:
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for p in package_modules()
             for n, line in enumerate(p.read_text().splitlines(), 1) if NUMBERED.search(line)]
    assert not found, "\n".join(found)


def test_help_names_things_not_papers_or_issues() -> None:
    from streamjoin.cli import app

    root, runner, found = get_command(app), CliRunner(), []

    def visit(command, path: list[str]) -> None:  # type: ignore[no-untyped-def]
        shown = runner.invoke(root, [*path, "--help"], terminal_width=200)
        assert shown.exit_code == 0, (path, shown.output)
        found.extend(f"streamjoin {' '.join(path)}: {m.group()}" for m in NUMBERED.finditer(shown.output))
        for name, sub in getattr(command, "commands", {}).items():
            visit(sub, [*path, name])

    visit(root, [])
    assert not found, found
