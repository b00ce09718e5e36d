"""benchmarks/compile_memory.py's table: compiled minus eager per size, a failed group's reason."""

from __future__ import annotations

from benchmarks import compile_memory as cm


def test_the_table_shows_the_difference_per_size_and_a_failure_as_its_reason() -> None:
    mib = 2**20
    rows = [
        {
            "model": "gpt-tiny",
            "checkpointing": "none",
            "sizes": [2, 8],
            "eager_bytes": [20 * mib, 80 * mib],
            "compiled_bytes": [15 * mib, 80 * mib],
            "extra_bytes_by_size": [-5 * mib, 0],
            "speedup_by_size": [1.2, 1.05],
            "compile_s": 21.4,
        },
        {"model": "llama-tiny", "checkpointing": "full", "error": "timeout: no result"},
    ]
    lines = cm.table_lines(rows)
    assert len(lines) == 2 + 2 + 1
    assert (
        "| gpt-tiny | none | 2 | 20.0 MiB | 15.0 MiB | -5.00 MiB (-25.0%) | 1.20× | 21 s |" in lines
    )
    assert (
        "| gpt-tiny | none | 8 | 80.0 MiB | 80.0 MiB | +0.00 MiB (+0.0%) | 1.05× | 21 s |" in lines
    )
    assert any("llama-tiny | full" in line and "timeout: no result" in line for line in lines)
