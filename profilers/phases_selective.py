"""How exact the line in K is: the middle ``blocks:K`` measured against the none-full line.

A profile measures ``none``, ``full`` and one ``blocks:K`` at K = L // 2
(:func:`profilers.checkpointing.profiled`); every other K is priced on the line between the
nearest two, or for memory from the three's windows (:mod:`profilers.checkpointing_fits`).
The middle measurement is an anchor *and* a check: :func:`line_rows` writes, per precision,
one ``checkpointing_line`` row for memory and one for time whose value is (line through none
and full - measured) / measured at the middle K, so a profile states how far the model in K
would be off without the middle anchor.
"""

from __future__ import annotations

from collections.abc import Sequence

from profilers.checkpointing import middle_blocks, parse_checkpointing
from profilers.checkpointing_fits import line_error
from profilers.memory_model import MemoryModel
from profilers.profile_record import ProbeRow
from profilers.throughput import TimeModel

PROBE = "checkpointing_line"


def line_rows(
    memory: Sequence[MemoryModel],
    time: Sequence[TimeModel],
    num_layers: int,
    micro_batch_size: int,
) -> list[ProbeRow]:
    """One row per precision and kind (memory, time) with none, full and the middle K fitted
    (single device); none when the profile did not measure them."""
    middle = middle_blocks(num_layers)
    if middle is None:
        return []
    k = parse_checkpointing(middle).blocks
    rows: list[ProbeRow] = []
    for kind, models in (("memory", memory), ("time", time)):
        # Memory: full stands at K = L as every setting's peak is convex in K; time: full
        # recomputes L blocks (profilers.checkpointing_fits).
        w = k / num_layers
        precisions = dict.fromkeys(m.precision for m in models)
        for precision in precisions:
            found = {
                m.activation_checkpointing: m
                for m in models
                if m.precision == precision
                and m.parallelism == "single"
                and m.world_size == 1
                and getattr(m, "loss_chunks", 1) == 1
            }
            if not {"none", "full", middle} <= set(found):
                continue
            error = line_error(found["none"], found["full"], found[middle], w, micro_batch_size)
            what = "peak memory" if kind == "memory" else "forward+backward time"
            windows = all(
                isinstance(m, MemoryModel) and m.windows
                for m in (found["none"], found["full"], found[middle])
            )
            how = "from the windows of" if windows else "between"
            rows.append(
                ProbeRow(
                    probe=PROBE,
                    name=f"{precision}/{middle} {kind}",
                    status="ok",
                    reason=(
                        f"the none-full line in K is {error:+.1%} off the measured {what} of "
                        f"{middle} (of {num_layers} blocks) at micro-batch {micro_batch_size}; "
                        f"other K are priced {how} none, this one and full"
                    ),
                    precision=precision,
                    activation_checkpointing=middle,
                    micro_batch_size=micro_batch_size,
                    value=error,
                    unit="fraction",
                )
            )
    return rows
