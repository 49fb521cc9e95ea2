"""Where the suite's time went, read from the JUnit report the test command leaves in out/.

    python3 ops/slowest_tests.py [out/junit.xml] [--top 30] [--markdown]

Prints the run's wall time, the tests' summed time (more than the wall time when tests ran
side by side), the time per tier, and the slowest tests, each with its setup included."""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

DEFAULT = Path("out/junit.xml")


def read(report: Path) -> tuple[float, list[tuple[float, str, str]]]:
    """The run's wall time and (seconds, test id, outcome) for every test case in the report."""
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise SystemExit(f"{report}: no <testsuite> in it")
    cases = []
    for case in suite.iter("testcase"):
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        cases.append((float(case.get("time", 0) or 0), name, outcome))
    return float(suite.get("time", 0) or 0), cases


def tier(name: str) -> str:
    parts = name.split("::")[0].split(".")
    if len(parts) > 2 and parts[1] == "integration" and parts[2].startswith("test_bench"):
        return "bench"
    return parts[1] if len(parts) > 1 else "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--markdown", action="store_true", help="the slowest tests as a Markdown table")
    args = parser.parse_args(argv)
    if not args.report.exists():
        print(f"{args.report}: no report; run the README's test command first", file=sys.stderr)
        return 1
    wall, cases = read(args.report)
    by_tier: dict[str, float] = defaultdict(float)
    for seconds, name, _ in cases:
        by_tier[tier(name)] += seconds
    outcomes: dict[str, int] = defaultdict(int)
    for _, _, outcome in cases:
        outcomes[outcome] += 1
    slowest = sorted(cases, reverse=True)[: args.top]
    print(f"{len(cases)} tests ({', '.join(f'{n} {o}' for o, n in sorted(outcomes.items()))}); "
          f"wall {wall:.0f} s; summed test time {sum(c[0] for c in cases):.0f} s")
    print("by directory: " + ", ".join(f"{t} {s:.0f} s" for t, s in sorted(by_tier.items(), key=lambda x: -x[1])))
    if args.markdown:
        print("\n| # | seconds | test |\n|---|---|---|")
        for i, (seconds, name, _) in enumerate(slowest, 1):
            print(f"| {i} | {seconds:.1f} | `{name}` |")
    else:
        for seconds, name, outcome in slowest:
            print(f"{seconds:8.1f} s  {name}" + ("" if outcome == "passed" else f"  [{outcome}]"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
