"""The documentation site: it builds with `mkdocs build --strict` (a broken link, a broken
anchor or a page left out of the navigation fails), the README stays a front door, and the
product's pages carry no history (issue numbers, commit hashes: CHANGELOG.md holds those) and
name the papers by their short names (the word "seed" is the papers page's alone)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

# The issue's own check: an issue number, or a commit hash (7 to 40 hex digits before a word end).
HISTORY = re.compile(r"issue [0-9]+|[0-9a-f]{7,40}\b")
# Narration of change belongs in the changelog too.
CHANGE_NARRATION = re.compile(r"\bused to\b|before -> after|before/after|\bno longer\b", re.IGNORECASE)


def product_pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def findings(pattern: re.Pattern[str], pages: list[Path]) -> list[str]:
    return [f"{page.relative_to(REPO) if page.is_relative_to(REPO) else page.name}:{n}: {line.strip()}"
            for page in pages for n, line in enumerate(page.read_text().splitlines(), 1) if pattern.search(line)]


@pytest.mark.timeout(180)
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=170,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    built = tmp_path / "site"
    assert (built / "index.html").is_file()
    # every page of the navigation became a page of the site
    for page in DOCS.rglob("*.md"):
        assert (built / page.relative_to(DOCS).with_suffix(".html")).is_file(), page


def test_the_readme_is_a_front_door() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) <= 15_000, len(readme.encode())
    for must in ("streamjoin demo", "python3 -m pytest -q", "mkdocs build --strict", "job:", "## Pick a mode"):
        assert must in readme, must
    # every docs link in the README names a page that exists
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / target).is_file(), target


def test_no_page_carries_history() -> None:
    found = findings(HISTORY, product_pages())
    assert not found, "\n".join(found)
    narrated = findings(CHANGE_NARRATION, product_pages())
    assert not narrated, "\n".join(narrated)


def test_the_history_check_finds_what_it_is_for(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("fine\nas issue 12 said\nsince 8a2e7a1\nwrites 1000000 a second\nit used to wait\n")
    assert [f.split(":")[1] for f in findings(HISTORY, [page])] == ["2", "3", "4"]
    assert [f.split(":")[1] for f in findings(CHANGE_NARRATION, [page])] == ["5"]


def test_the_papers_are_named_only_on_their_page() -> None:
    pages = [p for p in product_pages() if p != DOCS / "papers.md"]
    found = findings(re.compile(r"seed", re.IGNORECASE), pages)
    assert not found, "\n".join(found)
    assert re.search(r"seed", (DOCS / "papers.md").read_text(), re.IGNORECASE)


def test_the_development_page_shows_the_sites_screenshots() -> None:
    page = (DOCS / "development" / "index.md").read_text()
    shots = re.findall(r"!\[[^\]]*\]\((img/[^)]+\.png)\)", page)
    assert len(shots) >= 2, shots
    for shot in shots:
        image = DOCS / "development" / shot
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", shot
