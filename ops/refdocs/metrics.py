"""docs/operations/metrics.md: every Prometheus metric the services export, read from the collectors
of the modules under services/, state/ and engine/ that create them, with the processes that
update each one (found from which modules of each service's process name it)."""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from refdocs.text import GENERATED, REPO, REPO_PACKAGES, md

# The services that serve /metrics, by the module each one's process runs, in the page's order.
PROCESSES = {
    "hash worker": "streamjoin.services.hash.main",
    "ring node": "streamjoin.services.ring.node",
    "SplitJoin core": "streamjoin.services.splitjoin.core",
    "SplitJoin merger": "streamjoin.services.splitjoin.merger",
    "coordinator": "streamjoin.services.coordinator.main",
}
SCANNED = ("services", "state", "engine")


@dataclass(frozen=True)
class Metric:
    """One metric as scraped: its name (counters with `_total`), type, labels and help, and the
    processes that update it."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str
    attribute: str  # module:NAME that creates it
    processes: tuple[str, ...]


def _module_name(path: Path, repo: Path) -> str:
    rel = path.relative_to(repo).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([REPO_PACKAGES[parts[0]]] + parts[1:])


def _sources(repo: Path) -> dict[str, ast.Module]:
    """The parsed modules under the scanned folders, by module name."""
    return {_module_name(p, repo): ast.parse(p.read_text())
            for top in SCANNED for p in sorted((repo / top).rglob("*.py"))}


def metric_modules(repo: Path) -> list[ModuleType]:
    """The modules that create Prometheus metrics (they import prometheus_client), imported."""
    found = []
    for name, tree in _sources(repo).items():
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        if any(m.split(".")[0] == "prometheus_client" for m in imported):
            found.append(importlib.import_module(name))
    return found


def _imports(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """The scanned modules `name` imports, at top level or inside functions."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name in known}
        elif isinstance(n, ast.ImportFrom) and n.module:
            base = n.module if n.level == 0 else ".".join(name.split(".")[:-n.level] + [n.module])
            out |= {f"{base}.{a.name}" for a in n.names if f"{base}.{a.name}" in known}
            out |= {base} & known
    return out


def _references(trees: dict[str, ast.Module]) -> dict[str, set[tuple[str, str]]]:
    """Per module, what it names: (module, ATTR) for `module.ATTR`, and (full.module, NAME) for
    `from full.module import NAME`."""
    out: dict[str, set[tuple[str, str]]] = {}
    for name, tree in trees.items():
        found = out.setdefault(name, set())
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
                found.add((n.value.id, n.attr))
            elif isinstance(n, ast.ImportFrom) and n.module:
                found |= {(n.module, a.name) for a in n.names}
    return out


def _users(refs: dict[str, set[tuple[str, str]]], module: ModuleType, attribute: str) -> set[str]:
    """The modules that name `module`'s `attribute` (as module.ATTR, or imported by name)."""
    short = module.__name__.rsplit(".", 1)[-1]
    return {name for name, found in refs.items()
            if (short, attribute) in found or (module.__name__, attribute) in found}


def _closures(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Each process's modules: what its module imports, transitively, never entering another
    process's module (a SplitJoin core does not run the merger)."""
    known = set(trees)
    others = set(PROCESSES.values())
    out = {}
    for process, entry in PROCESSES.items():
        seen, todo = {entry}, [entry]
        while todo:
            current = todo.pop()
            for m in _imports(current, trees[current], known) - seen - (others - {entry}):
                seen.add(m)
                todo.append(m)
        out[process] = seen
    return out


def _collected(obj: Any) -> tuple[str, str, tuple[str, ...], str] | None:
    """(name as scraped, type, labels, help) of a metric object, None when `obj` is none."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics import MetricWrapperBase

    if isinstance(obj, MetricWrapperBase):
        family = obj.describe()[0]
        return family.name, family.type, tuple(obj._labelnames), obj._documentation
    # A custom collector (services/metrics.py BlockHistogram): an instance with collect().
    if callable(getattr(obj, "collect", None)) and not isinstance(obj, (type, ModuleType, CollectorRegistry)):
        families = list(obj.collect())
        if len(families) == 1:
            f = families[0]
            labels = sorted({k for s in f.samples for k in s.labels if k not in ("le", "quantile")})
            return f.name, f.type, tuple(labels), f.documentation
    return None


def metrics(modules: list[ModuleType] | None = None, repo: Path | None = None) -> list[Metric]:
    """Every metric the given modules (default: those under services/, state/, engine/) create,
    sorted by name; every metric their registries hold is among them."""
    from prometheus_client import CollectorRegistry

    repo = repo or REPO
    modules = metric_modules(repo) if modules is None else modules
    trees = _sources(repo)
    closures, refs = _closures(trees), _references(trees)
    out: dict[str, Metric] = {}
    for module in modules:
        for attribute, obj in sorted(vars(module).items()):
            got = _collected(obj)
            if got is None:
                continue
            name, kind, labels, help_text = got
            users = _users(refs, module, attribute)
            processes = tuple(p for p, mods in closures.items() if users & mods)
            scraped = f"{name}_total" if kind == "counter" else name
            out[scraped] = Metric(scraped, kind, labels, help_text, f"{module.__name__}:{attribute}", processes)
        for registry in (r for r in vars(module).values() if isinstance(r, CollectorRegistry)):
            for family in registry.collect():
                scraped = f"{family.name}_total" if family.type == "counter" else family.name
                if scraped not in out:
                    labels = tuple(sorted({k for s in family.samples for k in s.labels if k != "le"}))
                    out[scraped] = Metric(scraped, family.type, labels, family.documentation, module.__name__, ())
    return [out[k] for k in sorted(out)]


METRICS_INTRO = """\
# Metrics

Every long-running service serves Prometheus metrics in the text format on `/metrics`, and its
health on `/healthz` (200 once it runs its loop, 503 before), on its metrics port:
`worker.metrics_port` for hash workers, ring nodes, SplitJoin cores and the merger,
`coordinator.metrics_port` for the coordinator, or the `--metrics-port` flag (0 = any free port;
a worker reports the address it picked in its heartbeats). The Helm chart serves them on
`metrics.port` (9100), annotates pods for scraping and can create a ServiceMonitor; the local
launcher writes the ports it picked to `ops/prometheus/targets.json`, which
`ops/prometheus/prometheus.yml` reads. The alerts built on these metrics, and what to do when one
fires, are in [Alerts and runbook](runbook.md).

How to read the tables:

- **Names as scraped.** A counter's samples end in `_total` (and `_created`, the time it
  started); a histogram's are `_bucket` (with the `le` label), `_sum` and `_count`.
- **Every process serves the whole registry.** A process shows every metric below, and a metric
  it never updates reads 0 (or, with labels, has no series): the tables list, per process, the
  metrics it updates. Give every target a `component` label (coordinator, worker or merger; the
  Helm chart's ServiceMonitor and the local launcher do) and filter on it, as
  `ops/prometheus/rules.yml` does.
- **The query service** serves no metrics of its own: each shared operator it runs is a
  hash-mode job whose workers export the hash worker's metrics.
"""


def metrics_page(items: list[Metric] | None = None) -> str:
    """docs/operations/metrics.md."""
    items = metrics() if items is None else items
    lines = [GENERATED, "", METRICS_INTRO.rstrip()]
    groups = [(p, [m for m in items if p in m.processes]) for p in PROCESSES]
    groups.append(("no service", [m for m in items if not m.processes]))
    for process, members in groups:
        if not members:
            continue
        title = "Not updated by any service" if process == "no service" else f"{process[0].upper()}{process[1:]}"
        lines += ["", f"## {title}", "", "| Metric | Type | Labels | Description |", "|---|---|---|---|"]
        lines += [f"| `{m.name}` | {m.type} | {', '.join(f'`{x}`' for x in m.labels) or '-'} | {md(m.help)} |"
                  for m in members]
    return "\n".join(lines).rstrip() + "\n"


def absent_metrics(page: str, items: list[Metric]) -> list[str]:
    """The metrics whose entry `page` lacks."""
    return [m.name for m in items if f"\n| `{m.name}` |" not in page]
