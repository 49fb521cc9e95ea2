"""The reference pages written from the code: every job-file field (the settings models), every
command and option of the CLI (the typer app) and every Prometheus metric the services export.

    python3 ops/docs_reference.py           # writes the three pages
    python3 ops/docs_reference.py --check   # exit 1, naming the pages that differ from the code

Never edit the pages by hand: change a field's `description=`, an option's `help=` or a metric's
help text, and run this. The pages are built by ops/refdocs/ (job_file, cli, metrics);
tests/unit/test_docs_reference.py fails when a page is stale, or when a field, command, option or
metric lacks its entry (`absent_*`) or its text."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ops/refdocs, when imported rather than run

from refdocs.cli import cli_page  # noqa: E402
from refdocs.job_file import job_file_page  # noqa: E402
from refdocs.metrics import metrics_page  # noqa: E402
from refdocs.text import HASHLIKE, REPO  # noqa: E402

JOB_FILE_PAGE = Path("docs/reference/job-file.md")
CLI_PAGE = Path("docs/reference/cli.md")
METRICS_PAGE = Path("docs/operations/metrics.md")
FORBIDDEN = re.compile(r"seed", re.IGNORECASE)  # the docs' rule: random state is never called that


def pages() -> dict[Path, str]:
    """Each page's path (relative to the repository) and its text, as the code says it now.
    ValueError when a page would break the docs' rules (a hash-like run of hex, the forbidden word)."""
    out = {JOB_FILE_PAGE: job_file_page(), CLI_PAGE: cli_page(), METRICS_PAGE: metrics_page()}
    for path, text in out.items():
        for n, line in enumerate(text.splitlines(), 1):
            if HASHLIKE.search(line) or FORBIDDEN.search(line):
                raise ValueError(f"{path}:{n} breaks the docs' rules (hex run or forbidden word): {line}")
    return out


def stale(repo: Path = REPO) -> list[str]:
    """What differs between the committed pages and the code: one line per page, with its first
    differing lines."""
    out = []
    for path, text in pages().items():
        target = repo / path
        have = target.read_text() if target.is_file() else ""
        if have != text:
            diff = list(difflib.unified_diff(have.splitlines(), text.splitlines(), str(path), "generated", n=0,
                                             lineterm=""))
            out.append(f"{path} differs from the code:\n  " + "\n  ".join(diff[2:12]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 listing the pages that differ; write nothing")
    args = parser.parse_args()
    if args.check:
        differ = stale()
        print("\n".join(differ) or "the reference pages match the code")
        if differ:
            print("run `python3 ops/docs_reference.py` to write them")
        return 1 if differ else 0
    for path, text in pages().items():
        (REPO / path).write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
