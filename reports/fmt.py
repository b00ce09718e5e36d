"""Number formatting for the page: one place, so every table reads the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from profilers.metrics_record import finite_number
from strategies.prediction import memory_size

KiB, MiB, GiB = 2**10, 2**20, 2**30
DASH = "—"


# A finite float, or None (missing, null, NaN, a non-number): how every value read from a
# run file is taken.
num = finite_number


def size(num_bytes: Any) -> str:
    """Binary units: 1.50 GiB, 412.3 MiB, 12.0 KiB, 512 B."""
    x = num(num_bytes)
    if x is None:
        return DASH
    if abs(x) >= GiB:
        value = x / GiB
        return f"{value:.2f} GiB" if abs(value) < 100 else f"{value:.1f} GiB"
    return memory_size(x)  # below 1 GiB: the messages' units and rounding, one owner


def rate(tokens_per_s: Any) -> str:
    x = num(tokens_per_s)
    if x is None:
        return DASH
    if x >= 1e6:
        return f"{x / 1e6:.2f}M tok/s"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k tok/s"
    return f"{x:,.0f} tok/s"


def with_interval(
    show: Callable[[Any], str], value: Any, interval: tuple[float, float] | None
) -> str:
    """A value and, when there is one, its interval: ``5,689 tok/s (5,197 – 6,228 tok/s)``
    written with ``show`` on each end."""
    if interval is None:
        return show(value)
    return f"{show(value)} ({show(interval[0])} – {show(interval[1])})"


def seconds(value: Any) -> str:
    x = num(value)
    if x is None:
        return DASH
    if x >= 120:
        return f"{x / 60:.1f} min"
    if x >= 1:
        return f"{x:.2f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.1f} ms"
    return f"{x * 1e6:.0f} µs"


def flops(value: Any) -> str:
    """FLOP/s in the unit that reads best (TFLOP/s on GPUs, GFLOP/s on CPUs)."""
    x = num(value)
    if x is None:
        return DASH
    if x >= 1e12:
        return f"{x / 1e12:.1f} TFLOP/s"
    return f"{x / 1e9:.1f} GFLOP/s"


def count(value: Any) -> str:
    x = num(value)
    if x is None:
        return DASH
    if abs(x) >= 1e9:
        return f"{x / 1e9:.2f}B"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.2f}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:,.0f}"


def ratio(value: Any) -> str:
    x = num(value)
    return DASH if x is None else f"{x:.2f}×"


def percent(value: Any, signed: bool = False) -> str:
    x = num(value)
    if x is None:
        return DASH
    return f"{x * 100:+.1f}%" if signed else f"{x * 100:.1f}%"


def plain(value: Any) -> str:
    """Anything else, as the user would type it (None → dash, floats short)."""
    if value is None or value == "":
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def model_label(spec: Any, args: Any = None, num_params: Any = None) -> str:
    """What was built, not only the preset it started from: ``gpt-small (n_layer=40,
    n_embd=5120; 13.02B params)``. A profile of a 13B model built from ``gpt-small`` with
    overrides must not read "gpt-small"."""
    parts = []
    if hasattr(args, "items") and args:
        parts.append(", ".join(f"{k}={v}" for k, v in args.items()))
    if num(num_params) is not None:
        parts.append(f"{count(num_params)} params")
    return str(spec or "a model") + (f" ({'; '.join(parts)})" if parts else "")
