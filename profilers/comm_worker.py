"""The code each rank runs under torch's elastic launcher: time collectives the nccl-tests way.

Per (message size, collective): allocate the buffers, run ``num_warmup`` untimed collectives,
time one to choose how many go in a sample (so a sample of tiny messages is not all timer
noise), then take ``num_samples`` samples. A sample is: barrier, synchronize, start the clock,
``iters`` collectives back to back, synchronize, stop; the per-op time is all-reduced with MAX so
every rank holds the slowest rank's time. Sizes grow until ``max_bytes``, the memory cap, or the
time budget (predicted from the last size) stops them; ranks agree on stopping through a MAX
all-reduce, so no rank is left waiting in a collective the others skipped.

Rank 0 appends one JSON line per event to ``spec.results_path`` and flushes, so the parent can
report progress while we run and keeps every sample measured before a crash.
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import torch
import torch.distributed as dist

# Known departures from the textbook algorithm, recorded with every sample they affect.
# Gloo has no native reduce-scatter: ProcessGroupGloo::_reduce_scatter_base all-reduces the whole
# input and keeps this rank's chunk (pytorch/pytorch#118911), moving ~2x the bytes of a ring
# reduce-scatter. It is what gloo users (e.g. FSDP on CPU) actually pay, so we time it as is.
IMPLEMENTATION_NOTES: dict[tuple[str, str], str] = {
    ("gloo", "reduce_scatter"): "gloo: all_reduce of the full input + local chunk (~2x traffic)",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSpec:
    """What every rank is asked to do; picklable, sent whole to each spawned rank.

    ``fault`` is a test hook: ``("raise", rank)`` makes that rank raise after its first sample,
    ``("hang", rank)`` makes it sleep forever there, to exercise the failure paths.
    """

    backend: str
    device_type: str
    collectives: tuple[str, ...]
    sizes: tuple[int, ...]
    launch_started_unix: float
    deadline_unix: float
    hard_timeout_s: float
    timeout_s: float
    results_path: str
    num_warmup: int = 2
    num_samples: int = 5
    target_sample_s: float = 0.02
    max_iters_per_sample: int = 50
    min_sizes: int = 5  # always up to ~1 MiB (4 KiB x 4^4): the bandwidth needs MiB messages
    fault: tuple[str, int] | None = None


def run_worker(spec: WorkerSpec) -> None:
    """Entry point of one rank (called by the launcher with LOCAL_RANK, RANK... in the env)."""
    entered = time.time()
    # Last line of defence against a hang nothing else catches: dump every thread's stack to
    # stderr (kept in the rank's log) and exit; the launcher then stops the other ranks.
    faulthandler.dump_traceback_later(spec.hard_timeout_s, exit=True)
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    if spec.device_type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        # Ranks share the host's cores; gloo runs its own threads, keep torch's pool out of them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world_size))
        if spec.backend == "gloo" and sys.platform.startswith("linux"):
            # One host: loopback is the path between ranks (and never needs a resolvable hostname).
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    before_init = time.time()
    dist.init_process_group(
        spec.backend,
        timeout=datetime.timedelta(seconds=spec.timeout_s),
        # NCCL: bind the communicator to this rank's GPU now (eager init, barrier knows it).
        device_id=device if spec.backend == "nccl" else None,
    )
    try:
        _measure_all(spec, device, entered=entered, init_s=time.time() - before_init)
    finally:
        dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # collectives are queued on the stream; wait for them


def _max_over_ranks(value: float, device: torch.device) -> float:
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())  # .item() syncs on CUDA


def _memory_cap_bytes(device: torch.device, local_world_size: int) -> int:
    """Largest message one rank may use: about 2x it is live (in + out) plus backend scratch."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * 0.5 / 3)
    available = _host_available_bytes()
    return int(available * 0.5 / 3 / local_world_size)


def _host_available_bytes() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _make_op(
    collective: str, num_bytes: int, world_size: int, device: torch.device
) -> Callable[[], object]:
    """A closure that runs one collective on preallocated buffers (zeros: no denormals, no inf)."""
    count = num_bytes // 4  # float32; sizes were rounded to a multiple of 4 * world_size
    if collective == "all_reduce":
        buffer = torch.zeros(count, device=device)
        return lambda: dist.all_reduce(buffer)
    if collective == "broadcast":
        buffer = torch.zeros(count, device=device)
        return lambda: dist.broadcast(buffer, src=0)
    if collective == "all_gather":
        shard = torch.zeros(count // world_size, device=device)
        gathered = torch.empty(count, device=device)
        # torch 2.13 renamed *_into_tensor to *_single; older releases only have the former.
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: all_gather(gathered, shard)
    if collective == "reduce_scatter":
        full = torch.zeros(count, device=device)
        shard = torch.empty(count // world_size, device=device)
        reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: reduce_scatter(shard, full)
    raise ValueError(f"unknown collective {collective!r}")


def _timed(op: Callable[[], object], iters: int, device: torch.device) -> float:
    dist.barrier()  # start together, as nccl-tests does
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        op()
    _synchronize(device)
    return _max_over_ranks((time.perf_counter() - start) / iters, device)


def _time_collective(
    spec: WorkerSpec, op: Callable[[], object], device: torch.device
) -> tuple[tuple[float, ...], int]:
    for _ in range(spec.num_warmup):
        op()
    one = _timed(op, 1, device)  # the same on every rank (MAX), so every rank picks the same iters
    iters = max(1, min(spec.max_iters_per_sample, int(spec.target_sample_s / max(one, 1e-9))))
    return tuple(_timed(op, iters, device) for _ in range(spec.num_samples)), iters


def _measure_all(spec: WorkerSpec, device: torch.device, *, entered: float, init_s: float) -> None:
    rank = dist.get_rank()
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    ready = _max_over_ranks(time.time(), device)
    spawn_s = _max_over_ranks(entered - spec.launch_started_unix, device)
    init_s = _max_over_ranks(init_s, device)
    cap = -_max_over_ranks(-_memory_cap_bytes(device, local_world_size), device)  # MIN over ranks
    out: IO[str] | None = open(spec.results_path, "a") if rank == 0 else None  # noqa: SIM115
    try:
        _emit(
            out,
            kind="init",
            launch_overhead_s=ready - spec.launch_started_unix,
            spawn_s=spawn_s,
            init_process_group_s=init_s,
            memory_cap_bytes=int(cap),
        )
        unsupported: set[str] = set()
        stopped_by = "max_bytes"
        for index, num_bytes in enumerate(spec.sizes):
            if num_bytes > cap:
                stopped_by = "memory"
                break
            size_started = time.time()
            for collective in spec.collectives:
                if collective in unsupported:
                    continue
                sample = _one_sample(spec, collective, num_bytes, device, first=index == 0)
                _emit(out, kind="sample", **sample)
                if sample["status"] == "unsupported":
                    unsupported.add(collective)
                if spec.fault is not None and spec.fault[1] == rank:
                    _inject_fault(spec.fault[0])
            if index + 1 >= len(spec.sizes):
                break
            # Predict the next size from this one (cost grows at most with the message size);
            # every rank votes and the MAX decides, so all ranks stop at the same size.
            cost = time.time() - size_started
            predicted_end = time.time() + cost * spec.sizes[index + 1] / num_bytes
            over = index + 1 >= spec.min_sizes and predicted_end > spec.deadline_unix
            if _max_over_ranks(float(over), device) > 0:
                stopped_by = "budget"
                break
        _emit(out, kind="end", stopped_by=stopped_by)
    finally:
        if out is not None:
            out.close()


def _one_sample(
    spec: WorkerSpec, collective: str, num_bytes: int, device: torch.device, *, first: bool
) -> dict[str, Any]:
    """Time one collective at one size. Support is decided at the first (smallest) size only:
    later failures (out of memory, a dead peer, a timeout) propagate and fail the run."""
    world_size = dist.get_world_size()
    record: dict[str, Any] = {
        "backend": spec.backend,
        "device_type": spec.device_type,
        "collective": collective,
        "world_size": world_size,
        "bytes": num_bytes,
        "implementation": IMPLEMENTATION_NOTES.get((spec.backend, collective), ""),
    }
    op = _make_op(collective, num_bytes, world_size, device)
    if first:
        try:
            op()  # a backend without this collective refuses here, on every rank alike
        except (RuntimeError, NotImplementedError, ValueError) as error:
            if isinstance(error, torch.OutOfMemoryError) or "timed out" in str(error).lower():
                raise
            dist.barrier()  # if only some ranks refused, this times out: an error, not a hang
            return {**record, "bytes": 0, "status": "unsupported", "reason": _one_line(error)}
    times, iters = _time_collective(spec, op, device)
    del op  # free the buffers before the next, larger size
    return {**record, "time_s": list(times), "iters_per_sample": iters, "status": "ok"}


def _inject_fault(kind: str) -> None:
    if kind == "raise":
        raise RuntimeError("injected fault: this rank raised on purpose (test hook)")
    if kind == "hang":
        while True:
            time.sleep(3600)
    raise ValueError(f"unknown fault {kind!r}")


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _emit(out: IO[str] | None, **event: Any) -> None:
    if out is not None:
        out.write(json.dumps(event) + "\n")
        out.flush()
