"""Defaults that several packages share and the profiler already needs (one owner each).

The profiler sizes its probes against the same memory budget a plan is later held to, and
``advisor profile``/``advisor run`` share its time budget; strategies, advisor and the CLI
import these rather than repeating the numbers. Defaults of the training config itself (model,
data, sequence length, global batch, run length) belong to strategies.config.
"""

from __future__ import annotations

# Fraction of device memory (CPU: of the RAM available when profiled) a probed config or a
# planned one may use; the rest is headroom for what neither the trace nor the measured
# overheads see.
DEFAULT_MEMORY_BUDGET = 0.9

# Seconds for every probe of ``advisor profile``: the default profile of gpt-tiny on two CPU
# cores fits in it (README, "advisor profile").
DEFAULT_PROFILE_BUDGET_S = 120.0
# The devices a profile's memory traces can be for (``advisor profile --trace-for``): a CPU, or
# a CUDA GPU (512-byte blocks, CUDA autocast's fp32 norms and softmax) whatever device probes.
TRACE_TARGETS: tuple[str, ...] = ("cpu", "cuda")
