"""One installed package, and imports that point one way.

The wheel's only top-level package is `streamjoin`; the repository's top-level
folders are mapped under it (pyproject's package-dir). No module imports a
folder as a top-level package (`from engine ...` would load a second copy),
and the layers import downwards only:
    settings (leaf) <- engine <- schemas, topology <- state <- services <- CLI (streamjoin.*)
Inside services, each mode has a room of its own (MODES): a mode imports services/io (Kafka's
plumbing) and the shared modules beside it, never another mode's room; io and the shared
modules import no mode. Kafka transactions are begun and ended in one module (io/transactions.py),
which also holds the process's one hard exit.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
import tomllib
import warnings
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PACKAGE_DIRS = PROJECT["tool"]["setuptools"]["package-dir"]
FOLDERS = {d for d in PACKAGE_DIRS.values() if d != "streamjoin"}
# Rank of each layer: a module may import its own layer and those ranked lower.
LAYERS = {"streamjoin.settings": 0, "streamjoin.engine": 1, "streamjoin.schemas": 2, "streamjoin.topology": 2,
          "streamjoin.state": 3, "streamjoin.services": 4, "streamjoin": 5}
# The services' rooms, one per mode; everything else in services (io/, the shared modules) is common.
MODES = {"hash", "ring", "splitjoin", "queries", "coordinator", "spark"}
TRANSACTIONS = "streamjoin.services.io.transactions"


@functools.cache
def tracked_python_files() -> list[Path]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "*.py"], capture_output=True, text=True, check=True)
    return [REPO / line for line in out.stdout.split()]


@functools.cache
def syntax_tree(path: Path) -> ast.Module:
    """A tracked file parsed once for all the module's checks."""
    return ast.parse(path.read_text(), filename=str(path))


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in a file, function-level ones included."""
    tree = syntax_tree(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, node.module)]
    return found


def module_name(path: Path) -> str | None:
    """The installed name of a repository file, None outside the package (tests)."""
    rel = path.relative_to(REPO)
    for package, folder in sorted(PACKAGE_DIRS.items(), key=lambda kv: -len(kv[1])):
        if rel.parts[:len(Path(folder).parts)] == Path(folder).parts:
            rest = rel.parts[len(Path(folder).parts):]
            return ".".join([package, *rest]).removesuffix(".py").removesuffix(".__init__")
    return None


def layer_of(module: str) -> str | None:
    for layer in sorted(LAYERS, key=len, reverse=True):
        if module == layer or module.startswith(layer + "."):
            return layer
    return None


def test_no_file_imports_a_folder_as_a_top_level_package() -> None:
    bare = [f"{path.relative_to(REPO)}:{line}: {module}" for path in tracked_python_files()
            for line, module in imported_modules(path) if module.split(".")[0] in FOLDERS]
    assert not bare, "import these through the streamjoin namespace:\n" + "\n".join(bare)


def test_layers_import_downwards_only() -> None:
    wrong = []
    for path in tracked_python_files():
        own = module_name(path)
        if own is None:
            continue
        for line, module in imported_modules(path):
            target = layer_of(module)
            if target is not None and LAYERS[target] > LAYERS[layer_of(own)]:  # type: ignore[index]
                wrong.append(f"{own} ({layer_of(own)}) imports {module} ({target}), line {line}")
    assert not wrong, "\n".join(wrong)


def room_of(module: str) -> str | None:
    """The mode whose room `module` is in; None for io, the shared services modules and the rest."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["streamjoin", "services"] and len(parts) > 2 and parts[2] in MODES else None


def test_no_mode_imports_another_mode() -> None:
    wrong = []
    for path in tracked_python_files():
        own = module_name(path)
        if own is None or not own.startswith("streamjoin.services"):
            continue
        for line, module in imported_modules(path):
            target = room_of(module)
            if target is not None and target != room_of(own):
                wrong.append(f"{own} ({room_of(own) or 'common'}) imports {module} ({target}), line {line}")
    assert not wrong, "\n".join(wrong)


def calls_outside_tests(method: str) -> set[str]:
    """The modules (outside tests) with a call of an attribute named `method` (`x.method(...)`)."""
    found = set()
    for path in tracked_python_files():
        own = module_name(path)
        if own is None:
            continue
        for node in ast.walk(syntax_tree(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method:
                found.add(own)
    return found


def test_transactions_are_initialised_and_committed_in_one_module() -> None:
    assert calls_outside_tests("commit_transaction") == {TRANSACTIONS}
    assert calls_outside_tests("init_transactions") == {TRANSACTIONS}


def test_the_process_exits_hard_in_one_place() -> None:
    exits = calls_outside_tests("_exit")
    imported = {module_name(path) for path in tracked_python_files() if module_name(path)
                for node in ast.walk(syntax_tree(path)) if isinstance(node, ast.ImportFrom)
                and node.module == "os" and any(alias.name == "_exit" for alias in node.names)}
    assert exits == {TRANSACTIONS} and not imported


def test_every_package_folder_is_listed_for_the_wheel() -> None:
    listed = set(PROJECT["tool"]["setuptools"]["packages"])
    on_disk = {module_name(init.parent / "__init__.py") for folder in {"streamjoin", *FOLDERS}
               for init in (REPO / folder).rglob("__init__.py")}
    assert on_disk == listed, f"on disk, not listed: {on_disk - listed}; listed, not on disk: {listed - on_disk}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The project's wheel, built once for the module's checks from a copy of the tracked tree
    as a clone has it (the build writes build/ there): a build costs tens of seconds."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "src"
    for path in subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True,
                               check=True).stdout.split():
        if (REPO / path).is_file():
            (source / path).parent.mkdir(parents=True, exist_ok=True)
            (source / path).write_bytes((REPO / path).read_bytes())
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
                   check=True, capture_output=True)
    return zipfile.ZipFile(next(out.glob("streamjoin-*.whl")))


@pytest.mark.timeout(300)
def test_wheel_holds_one_top_level_package(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert wheel.read(top_level).decode().split() == ["streamjoin"]
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"streamjoin"}
    expected = {f"{module_name(p).replace('.', '/')}{'/__init__' if p.name == '__init__.py' else ''}.py"
                for p in tracked_python_files() if module_name(p)}
    assert expected <= set(names), sorted(expected - set(names))
    assert "streamjoin/jobs/equijoin.yaml" in names


# What only the Spark jobs, the benchmarks and the docs site need: never a requirement of the services' install.
EXTRA_ONLY = {"pyspark": "spark", "matplotlib": "spark", "psutil": "bench", "mkdocs": "docs", "mkdocs-material": "docs"}


@pytest.mark.integration  # a wheel build: tens of seconds
@pytest.mark.timeout(300)
def test_wheel_requires_the_extras_only_for_spark_bench_and_docs(wheel: zipfile.ZipFile) -> None:
    metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    required = [line.removeprefix("Requires-Dist:").strip() for line in metadata.splitlines()
                if line.startswith("Requires-Dist:")]
    plain = {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in required if "extra ==" not in r}
    assert not plain & EXTRA_ONLY.keys(), sorted(plain & EXTRA_ONLY.keys())
    for package, extra in EXTRA_ONLY.items():
        assert any(r.lower().startswith(package) and f'extra == "{extra}"' in r for r in required), (package, extra)
    # the benchmark modules stay in the wheel (`pip install 'streamjoin[bench]'` runs them), without their dependencies
    assert "streamjoin/bench/__init__.py" in wheel.namelist()


def test_services_and_cli_import_no_extra() -> None:
    """The CLI and every service it runs (the modules its service commands import) load without
    the benchmarks, Spark, matplotlib or psutil: the services' install does not have them."""
    tree = ast.parse((REPO / "streamjoin" / "cli" / "run.py").read_text())
    services = sorted({node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                       and node.module and node.module.startswith("streamjoin.services")})
    probe = ("import importlib, sys\n"
             f"for name in {['streamjoin.cli', *services]!r}:\n"
             "    importlib.import_module(name)\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'matplotlib', 'psutil')\n"
             "             or m.startswith('streamjoin.bench')))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_old_udf_spelling_still_loads_with_a_deprecation_warning() -> None:
    from streamjoin.engine.predicates import load_udf
    from streamjoin.engine.udfs import pixel_similarity

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert load_udf("similar", "engine.udfs:pixel_similarity") is pixel_similarity
    assert any(issubclass(w.category, DeprecationWarning) and "streamjoin.engine.udfs" in str(w.message)
               for w in caught)
    assert "engine" not in sys.modules  # the old name never became a module of its own
