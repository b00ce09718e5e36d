"""The code's layout rules (DESIGN.md, "Layout and the one-way dependency rule"), checked on
the source: imports run one way, no module imports itself back through others, and each
run-directory file name is written in one place (profilers/rundir.py)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from profilers import rundir

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("profilers", "strategies", "reports", "advisor")  # bottom to top
SOURCES = (*PACKAGES, "benchmarks", "scripts")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The module an import names: the longest known module prefix."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path) -> Iterator[tuple[str, ast.ImportFrom | ast.Import]]:
    """Every module this file imports, at top level or inside a function (a lazy import still
    runs: it closes a circle as surely as one at the top). ``from pkg import sub`` names the
    module pkg.sub when there is one."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield (full if full in MODULES else node.module), node


def imported_names(path: Path) -> set[str]:
    """The modules a file's import statements name, as written (``from m import x`` names m);
    for the per-package purity tests (tests/strategies, tests/reports)."""
    names: set[str] = set()
    for _name, node in _imports(path):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif node.module:
            names.add(node.module)
    return names


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for name, _node in _imports(path):
            target = _owner(name)
            if target is not None and target != module:
                graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_run_one_way() -> None:
    """advisor → reports → strategies → profilers: never upwards."""
    rank = {package: i for i, package in enumerate(PACKAGES)}
    for module, targets in _graph().items():
        mine = rank[module.split(".")[0]]
        for target in targets:
            assert rank[target.split(".")[0]] <= mine, f"{module} imports {target} (upwards)"


# profilers modules that hold records and arithmetic only (no torch at import time, no probe):
# all that strategies and reports may import from the package below them.
PROFILER_RECORDS = {
    "profilers.checkpointing",
    "profilers.checkpointing_fits",
    "profilers.comm_records",
    "profilers.compile_records",
    "profilers.defaults",
    "profilers.device",
    "profilers.device_records",
    "profilers.fit",
    "profilers.flops",
    "profilers.hardware",
    "profilers.memory_model",
    "profilers.memory_records",
    "profilers.metrics_record",
    "profilers.profile_record",
    "profilers.rundir",
    "profilers.throughput",
    "profilers.workload",
}


@pytest.mark.parametrize("package", ["strategies", "reports"])
def test_pure_packages_import_no_torch_and_no_probe(package: str) -> None:
    """strategies is arithmetic over records, reports reads run files: neither imports torch,
    advisor, or probe code (DESIGN.md); each may import profilers' records."""
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    for path in files:
        for name in imported_names(path):
            top = name.split(".")[0]
            assert top not in ("torch", "advisor"), f"{path.name} imports {name}"
            if top == "profilers":
                assert name in PROFILER_RECORDS, f"{path.name} imports probe code {name}"


def test_no_module_imports_a_package_that_imports_it_back() -> None:
    """A module inside a package whose __init__ re-exports its submodules imports its siblings
    by their own names (``import reports.fmt``), not through the package (``from reports
    import fmt``): that __init__ imports the module back."""
    graph = _graph()
    reexporting = {
        m
        for m, path in MODULES.items()
        if path.name == "__init__.py" and any(t.startswith(m + ".") for t in graph[m])
    }
    for module, path in MODULES.items():
        for _name, node in _imports(path):
            package = node.module if isinstance(node, ast.ImportFrom) else None
            inside = package is not None and module.startswith(package + ".")
            if inside and package in reexporting:
                pytest.fail(f"{module} imports from its package {package}: name the module")


# -- run-file names ---------------------------------------------------------------------------

RUN_FILE_NAMES = (
    rundir.PROFILE,
    rundir.PROBES,
    rundir.PLAN,
    rundir.TRIALS,
    rundir.STUDY,
    rundir.RUN_LOG,
    rundir.REPORT,
    rundir.METRICS,
    rundir.TRAIN_CONFIG,
    rundir.LAUNCH_CONFIG,
    rundir.CHECKPOINTS,
    rundir.LATEST_CHECKPOINT,
    rundir.TRAIN_LOG,
    rundir.RANKS_STDOUT,
)
CHECKPOINT_LITERAL = re.compile(rf"^\.?{rundir.CHECKPOINT_PREFIX}(\d|$)")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _is_path_literal(text: str) -> bool:
    """A string used as a run file's path: the name itself, or a path ending or starting with
    it (prose that mentions a file, in a help text or a message, is not flagged)."""
    for name in RUN_FILE_NAMES:
        if text == name or text.endswith("/" + name) or text.startswith(name + "/"):
            return True
    return bool(CHECKPOINT_LITERAL.match(text))


def _strings(tops: tuple[str, ...]) -> Iterator[tuple[str, int, str]]:
    """(file, line, text) of every string literal that is not a docstring, under ``tops``."""
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            docstrings = _docstrings(tree)
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and id(node) not in docstrings
                ):
                    yield str(path.relative_to(ROOT)), node.lineno, node.value


def test_run_file_names_are_written_only_by_their_owner() -> None:
    owner = str((ROOT / "profilers" / "rundir.py").relative_to(ROOT))
    offenders = [
        f"{path}:{line} {text!r}"
        for path, line, text in _strings(SOURCES)
        if path != owner and _is_path_literal(text)
    ]
    assert offenders == [], "run-file names outside profilers/rundir.py: " + ", ".join(offenders)


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("plan.json", True),
        ("train/metrics.jsonl", True),
        ("checkpoints/latest", True),
        ("step_", True),
        (".step_", True),
        ("step_time_s", False),
        ("plan.json from 'advisor recommend'", False),
    ],
)
def test_what_counts_as_a_run_file_literal(text: str, flagged: bool) -> None:
    assert _is_path_literal(text) is flagged


def test_no_user_visible_text_names_an_issue() -> None:
    """Messages and help texts speak to users, not to the project's issue tracker."""
    pattern = re.compile(r"\bissue\s*#?\d", re.IGNORECASE)
    offenders = [f"{p}:{line}" for p, line, text in _strings(PACKAGES) if pattern.search(text)]
    assert offenders == []
