"""A cache of trace-only profiles that knows which code traced them.

The what-if benchmarks (``whatif_published.py``, ``knobs_whatif.py``) cache one profile per
model shape under ``benchmarks/results/whatif_profiles/``: tracing a 70B shape takes a minute or
two. Keyed by shape alone, a cached profile outlived the code that traced it: a change to a
model's block (what its forward keeps) or to the tracer left the old bytes in place, and the
benchmark went on reporting them until someone deleted the files by hand.

Here every cached profile is recorded with a fingerprint of the code that produced it:

* the *modules*: the import closure, in a fresh interpreter, of the modules that build a model
  and trace or count its step (:data:`TRACING_MODULES`, every module of :data:`TRACING_PACKAGES`),
  restricted to this repository's packages;
* the benchmark's own *definitions* (functions, constants) that turn traces into a profile
  (extending 1-/2-layer fits to the real depth, the FSDP rank's traces …), named per file.

Each is hashed from its syntax tree with docstrings removed, so a comment or docstring edit
keeps the cache, and any change to code keeps nothing it could have moved. A profile whose
fingerprint differs (or that was cached before fingerprints) is traced again, and the benchmark
says which sources changed. The index is ``SOURCES.json`` beside the profiles: the distinct
fingerprints (source name -> hash) and, per profile, the fingerprint it was traced under.
"""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profilers.rundir import write_atomically

ROOT = Path(__file__).resolve().parent.parent
INDEX = "SOURCES.json"
PROJECT_PACKAGES = ("advisor", "profilers", "strategies")
# What builds a model and traces or counts its step; their import closure is fingerprinted.
TRACING_MODULES: tuple[str, ...] = (
    "advisor.workload",
    "profilers.checkpointing",
    "profilers.checkpointing_fits",
    "profilers.flops",
    "profilers.memory",
    "profilers.memory_blocks",
    "profilers.memory_distributed",
    "profilers.memory_grad_sums",
    "profilers.memory_model",
    "profilers.memory_tracing",
    "profilers.phases_chunked",
    "profilers.profile_record",
    "profilers.workload",
)
# Packages imported whole: their modules are also imported lazily, inside functions.
TRACING_PACKAGES: tuple[str, ...] = ("advisor.models", "advisor.trainer", "advisor.data")

_CLOSURE = """
import importlib, json, pkgutil, sys
modules, packages, roots = json.loads(sys.argv[1])
for name in modules:
    importlib.import_module(name)
for name in packages:
    package = importlib.import_module(name)
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(name + "." + info.name)
out = {}
for name, module in sorted(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if path and name.split(".")[0] in roots:
        out[name] = path
print(json.dumps(out))
"""


def module_closure(
    modules: Sequence[str],
    packages: Sequence[str] = (),
    roots: Sequence[str] = PROJECT_PACKAGES,
    cwd: Path = ROOT,
) -> dict[str, Path]:
    """Module name -> source file of everything importing ``modules`` and every module of
    ``packages`` loads from the ``roots`` packages, in a fresh interpreter (so what this
    process happens to have imported does not enter)."""
    done = subprocess.run(
        [sys.executable, "-c", _CLOSURE, json.dumps([list(modules), list(packages), list(roots)])],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"could not import the tracing modules to fingerprint them: {last}")
    return {name: Path(path) for name, path in json.loads(done.stdout).items()}


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return tree


def code_hash(tree: ast.AST) -> str:
    """A hash of what the code does: its syntax tree without docstrings (comments are not in
    the tree), so neither moves it."""
    dumped = ast.dump(_strip_docstrings(tree), annotate_fields=False, include_attributes=False)
    return hashlib.sha256(dumped.encode()).hexdigest()[:16]


def definition_hashes(path: Path, names: Iterable[str]) -> dict[str, str]:
    """``file:name`` -> hash of each named top-level function, class or assignment of
    ``path`` (an assignment of several names counts for each)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        found[name.id] = node
    names = list(names)
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"{path.name}: no top-level definition of {', '.join(missing)}")
    return {f"{path.name}:{n}": code_hash(found[n]) for n in names}


@dataclass(frozen=True)
class Fingerprint:
    """Source name -> hash; ``key`` names the whole."""

    sources: Mapping[str, str]

    @property
    def key(self) -> str:
        text = json.dumps(dict(sorted(self.sources.items())))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def changed(self, old: Mapping[str, str]) -> list[str]:
        """The sources that differ from ``old``'s (added, removed or edited), sorted."""
        return sorted(n for n in {*old, *self.sources} if old.get(n) != self.sources.get(n))


def fingerprint(
    definitions: Mapping[Path, Sequence[str]],
    modules: Sequence[str] = TRACING_MODULES,
    packages: Sequence[str] = TRACING_PACKAGES,
    roots: Sequence[str] = PROJECT_PACKAGES,
    cwd: Path = ROOT,
) -> Fingerprint:
    sources = {
        name: code_hash(ast.parse(path.read_text(), filename=str(path)))
        for name, path in module_closure(modules, packages, roots, cwd).items()
    }
    for path, names in definitions.items():
        sources.update(definition_hashes(path, names))
    return Fingerprint(sources)


class ProfileCache:
    """Profiles (as JSON) under ``directory``, each valid while the fingerprint it was traced
    under is the current one. ``current`` is computed once, on first use."""

    def __init__(self, directory: Path, current: Any) -> None:
        self.directory = directory
        self._current = current  # a Fingerprint, or a callable returning one

    @property
    def fingerprint(self) -> Fingerprint:
        if not isinstance(self._current, Fingerprint):
            self._current = self._current()
        return self._current

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def _index(self) -> dict[str, Any]:
        path = self.directory / INDEX
        if not path.is_file():
            return {"fingerprints": {}, "profiles": {}}
        return json.loads(path.read_text())

    def stale(self, key: str) -> str | None:
        """Why the cached profile ``key`` cannot be used (None: it can, or there is none)."""
        if not self.path(key).is_file():
            return None
        index = self._index()
        traced = index["profiles"].get(key)
        if traced is None:
            return "cached before its tracing code was fingerprinted"
        if traced == self.fingerprint.key:
            return None
        changed = self.fingerprint.changed(index["fingerprints"].get(traced, {}))
        shown = ", ".join(changed[:4]) + (
            f" and {len(changed) - 4} more" if len(changed) > 4 else ""
        )
        return f"traced by other code (changed since: {shown})"

    def load(self, key: str, say: Any = print) -> dict[str, Any] | None:
        """The cached profile's JSON, or None when there is none or it is stale (said)."""
        if not self.path(key).is_file():
            return None
        why = self.stale(key)
        if why is not None:
            say(f"  cached profile {key}: {why}; tracing it again")
            return None
        return json.loads(self.path(key).read_text())

    def save(self, key: str, data: Mapping[str, Any]) -> None:
        """Write the profile and record it under the current fingerprint (fingerprints no
        profile uses any more are dropped from the index)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path(key), json.dumps(data, indent=1) + "\n")
        index = self._index()
        current = self.fingerprint
        index["profiles"][key] = current.key
        index["fingerprints"][current.key] = dict(sorted(current.sources.items()))
        used = set(index["profiles"].values())
        index["fingerprints"] = {k: v for k, v in index["fingerprints"].items() if k in used}
        index["profiles"] = dict(sorted(index["profiles"].items()))
        write_atomically(self.directory / INDEX, json.dumps(index, indent=1) + "\n")
