"""The device probe's micro-benchmarks: GEMM throughput per dtype and memory bandwidth.

Timing discipline (nanoGPT's): one warm-up call discarded (allocation, kernel selection, lazy
init), then timed calls, each between two device synchronisations, median of the samples. When
even one timed call cannot fit in the remaining budget the warm-up itself is the only sample
(``warmup_only``), an upper bound on the time.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

from profilers.device_records import Benchmark

if TYPE_CHECKING:
    import torch


def device_sync(dev: torch.device) -> Callable[[], None]:
    import torch

    if dev.type == "cuda":
        return lambda: torch.cuda.synchronize(dev)
    return lambda: None


def time_call(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    """Seconds of one call, between two synchronisations (kernels are async on CUDA)."""
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def _timed(
    fn: Callable[[], object], sync: Callable[[], None], budget_s: float, *, max_reps: int = 10
) -> tuple[tuple[float, ...], bool]:
    """(samples, warmup_only): one discarded warm-up, then calls while the budget holds."""
    deadline = time.perf_counter() + budget_s
    warmup = time_call(fn, sync)
    samples: list[float] = []
    while len(samples) < max_reps:
        expected = statistics.median(samples) if samples else warmup
        if time.perf_counter() + expected > deadline:
            break
        samples.append(time_call(fn, sync))
    return (tuple(samples), False) if samples else ((warmup,), True)


SKIPPED = "skipped: its share of budget_s was too small"


def matmul_benchmark(dev: torch.device, dtype: str, budget_s: float, free: int) -> Benchmark:
    """n×n GEMM; n doubles from a small start until one call takes ``target`` seconds."""
    import torch

    name = f"matmul_{dtype}"
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
    cuda = dev.type == "cuda"
    n, target, n_max = (1024, 0.005, 16384) if cuda else (512, 0.01, 2048)
    element = torch.finfo(torch_dtype).bits // 8
    while n_max > n and 3 * n_max * n_max * element > free // 4:  # a, b, out in a quarter
        n_max //= 2
    if budget_s < 0.01:
        return Benchmark(name=name, size=0, work=0.0, error=SKIPPED)
    start, sync = time.perf_counter(), device_sync(dev)
    try:
        with _tf32(dev, dtype == "tf32"):
            while True:
                gemm = _gemm(n, dev, torch_dtype)
                time_call(gemm, sync)  # the first call at a size pays for setup
                # The faster of two: one call delayed by a neighbour must not stop the ramp.
                seconds = min(time_call(gemm, sync), time_call(gemm, sync))
                # A call at 2n costs ~8x; it needs three ramp calls and a few timed ones.
                left = budget_s - (time.perf_counter() - start)
                if seconds >= target or 2 * n > n_max or 8 * seconds * 7 > left:
                    break
                n *= 2
            samples, warmup_only = _timed(gemm, sync, budget_s - (time.perf_counter() - start))
    except Exception as exc:  # an unsupported dtype on this device, OOM, ...
        error = f"{type(exc).__name__}: {exc}"
        return Benchmark(name=name, size=n, work=2.0 * n**3, error=error)
    return Benchmark(name=name, size=n, work=2.0 * n**3, samples_s=samples, warmup_only=warmup_only)


def _gemm(n: int, dev: torch.device, dtype: torch.dtype) -> Callable[[], object]:
    import torch

    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    return lambda: torch.mm(a, b)


class _tf32:
    """Scope TF32 for CUDA GEMMs on (``tf32``) or off (every other dtype), then restore.

    Through the legacy switch ``torch.backends.cuda.matmul.allow_tf32``, which sets the legacy
    precision and the new ``fp32_precision`` together: setting only the new one while the legacy
    one says "highest" makes every cuBLAS GEMM raise "you have used mix of the legacy and new
    APIs" (ATen Context::allowTF32CuBLAS checks they agree). Both are restored on exit.
    """

    def __init__(self, dev: torch.device, enabled: bool) -> None:
        self.active, self.enabled = dev.type == "cuda", enabled
        self.old_legacy: str | None = None
        self.old_new: str | None = None

    def __enter__(self) -> None:
        import torch

        if not self.active:
            return
        matmul = torch.backends.cuda.matmul
        with warnings.catch_warnings():  # torch >= 2.9 warns that the legacy switch is legacy
            warnings.simplefilter("ignore")
            try:
                self.old_legacy = torch.get_float32_matmul_precision()
            except RuntimeError:  # the caller's settings already mix the two APIs
                self.old_legacy = None
            self.old_new = getattr(matmul, "fp32_precision", None)
            matmul.allow_tf32 = self.enabled

    def __exit__(self, *exc: object) -> None:
        import torch

        if not self.active:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if self.old_legacy is not None:
                torch.set_float32_matmul_precision(self.old_legacy)
            matmul = torch.backends.cuda.matmul
            # Only if the legacy call did not already bring it back: setting the new switch
            # needlessly would itself make a mix.
            if self.old_new is not None and matmul.fp32_precision != self.old_new:
                matmul.fp32_precision = self.old_new


def copy_benchmark(dev: torch.device, budget_s: float, free: int) -> Benchmark:
    """Device-memory bandwidth: copy a large tensor, counting read + write (STREAM's 'copy')."""
    import torch

    cap = 2 * 2**30 if dev.type == "cuda" else 256 * 2**20
    size = max(min(cap, free // (8 if dev.type == "cuda" else 16)), 16 * 2**20) // 4 * 4
    if budget_s < 0.01:
        return Benchmark(name="copy", size=size, work=2.0 * size, error=SKIPPED)
    try:
        src = torch.ones(size // 4, device=dev)  # written once: every page is touched
        dst = torch.zeros_like(src)
        samples, warmup_only = _timed(lambda: dst.copy_(src), device_sync(dev), budget_s)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        return Benchmark(name="copy", size=size, work=2.0 * size, error=error)
    return Benchmark(
        name="copy", size=size, work=2.0 * size, samples_s=samples, warmup_only=warmup_only
    )
