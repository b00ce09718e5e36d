"""The what-if benchmarks' profile cache: a profile is reused only while the code that traced it
is unchanged (benchmarks/profile_cache.py)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from benchmarks import profile_cache as pc
from benchmarks import whatif_published as wp


def test_comments_and_docstrings_do_not_move_a_hash_but_code_does() -> None:
    base = 'def f(x):\n    """Doc."""\n    return x + 1\n'
    reworded = 'def f(x):\n    """Other words."""\n    # a comment\n    return x + 1  # here too\n'
    changed = 'def f(x):\n    """Doc."""\n    return x + 2\n'
    h = pc.code_hash(ast.parse(base))
    assert pc.code_hash(ast.parse(reworded)) == h
    assert pc.code_hash(ast.parse(changed)) != h
    # A function that is only a docstring still parses to something hashable.
    assert pc.code_hash(ast.parse('def g():\n    """Only this."""\n'))


def _toy_package(root: Path) -> None:
    package = root / "toypkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from toypkg import b\n\ndef f():\n    return b.g()\n")
    (package / "b.py").write_text("def g():\n    return 1\n")
    (package / "c.py").write_text("X = 1\n")  # imported by nobody
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "lazy.py").write_text("def h():\n    from toypkg import c\n    return c.X\n")


def test_the_closure_is_what_a_fresh_interpreter_imports(tmp_path: Path) -> None:
    _toy_package(tmp_path)
    closure = pc.module_closure(["toypkg.a"], roots=["toypkg"], cwd=tmp_path)
    assert set(closure) == {"toypkg", "toypkg.a", "toypkg.b"}
    assert closure["toypkg.b"] == tmp_path / "toypkg" / "b.py"
    # A package named whole brings its modules, whatever imports them lazily.
    whole = pc.module_closure(["toypkg.a"], ["toypkg.sub"], roots=["toypkg"], cwd=tmp_path)
    assert {"toypkg.sub", "toypkg.sub.lazy"} <= set(whole) and "toypkg.c" not in whole


def test_a_module_that_cannot_be_imported_is_a_clear_error(tmp_path: Path) -> None:
    _toy_package(tmp_path)
    with pytest.raises(RuntimeError, match=r"could not import the tracing modules.*toypkg\.nope"):
        pc.module_closure(["toypkg.nope"], roots=["toypkg"], cwd=tmp_path)


def test_definitions_are_hashed_by_name_and_a_missing_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bench.py"
    path.write_text("A, B = 1, 2\nC: int = 3\n\ndef f():\n    return A\n\nclass K:\n    pass\n")
    hashes = pc.definition_hashes(path, ["A", "B", "C", "f", "K"])
    assert set(hashes) == {"bench.py:A", "bench.py:B", "bench.py:C", "bench.py:f", "bench.py:K"}
    assert hashes["bench.py:A"] == hashes["bench.py:B"]  # one assignment of both
    with pytest.raises(ValueError, match="no top-level definition of g"):
        pc.definition_hashes(path, ["f", "g"])


def test_a_profile_traced_by_other_code_is_not_reused(tmp_path: Path) -> None:
    said: list[str] = []
    old = pc.Fingerprint({"advisor.models.llama": "1", "bench.py:extend": "2"})
    pc.ProfileCache(tmp_path, old).save("shape-a", {"x": 1})
    assert pc.ProfileCache(tmp_path, old).load("shape-a", said.append) == {"x": 1}
    assert not said
    new = pc.Fingerprint({"advisor.models.llama": "9", "bench.py:extend": "2", "new.mod": "3"})
    cache = pc.ProfileCache(tmp_path, new)
    assert cache.load("shape-a", said.append) is None
    assert said == [
        "  cached profile shape-a: traced by other code (changed since: advisor.models.llama, "
        "new.mod); tracing it again"
    ]
    # Traced again under the new code: reused, and the old fingerprint leaves the index.
    cache.save("shape-a", {"x": 2})
    assert pc.ProfileCache(tmp_path, new).load("shape-a") == {"x": 2}
    index = json.loads((tmp_path / pc.INDEX).read_text())
    assert index["profiles"] == {"shape-a": new.key}
    assert list(index["fingerprints"]) == [new.key]


def test_a_profile_cached_before_fingerprints_is_traced_again(tmp_path: Path) -> None:
    (tmp_path / "shape-b.json").write_text("{}")
    cache = pc.ProfileCache(tmp_path, lambda: pc.Fingerprint({"m": "1"}))
    assert cache.stale("shape-b") == "cached before its tracing code was fingerprinted"
    assert cache.load("shape-b", lambda *_: None) is None
    assert cache.stale("never-cached") is None and cache.load("never-cached") is None


def test_the_whatif_fingerprint_covers_the_models_the_tracer_and_the_benchmark() -> None:
    sources = wp.tracing_fingerprint().sources
    # Imported lazily by the tracer or the model registry: still in (packages named whole).
    for module in (
        "advisor.models.llama",
        "advisor.models.gpt",
        "advisor.models.common",
        "advisor.trainer.step",
        "profilers.memory_tracing",
        "profilers.memory_distributed",
        "profilers.flops",
    ):
        assert module in sources, module
    for name in ("trace_only_profile", "extend_memory_model", "FSDP_TRACE_LAYERS"):
        assert f"whatif_published.py:{name}" in sources
    assert "knobs_whatif.py:with_kept_gathered" in sources
    # Prediction and reporting code is not tracing code: editing it must not throw the cache
    # away (the predictions are recomputed from the profiles on every run).
    for module in ("strategies.cost", "strategies.whatif", "strategies.roofline", "advisor.cli"):
        assert module not in sources, module
    assert "whatif_published.py:table_lines" not in sources
