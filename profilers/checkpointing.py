"""The activation-checkpointing settings: their names, how to read them, which blocks each wraps.

One value of the plan key ``activation_checkpointing`` (and ``--activation-checkpointing``):

* ``none``: nothing recomputed; every block's activations are saved for backward.
* ``full``: every repeated block is checkpointed (non-reentrant ``torch.utils.checkpoint``):
  only its input is saved and its whole forward runs again in backward.
* ``blocks:K``: K of the L repeated blocks are checkpointed, spread evenly (see
  :func:`checkpointed_blocks`); K in 1..L-1 (``blocks:0`` is ``none``, ``blocks:L`` is ``full``:
  both are refused, naming the setting to use). Memory and recompute both move linearly in K.
* ``ops``: every block is checkpointed with a selective policy: the outputs of matmuls and
  attention are saved, everything else (norms, activations, element-wise ops) is recomputed
  (``torch.utils.checkpoint.create_selective_checkpoint_contexts``). torchtitan's
  ``selective_ac_option = "op"`` is close but recomputes every other matmul too: that is
  ``ops-half``.
* ``ops-half``: torchtitan's ``op`` policy: every block checkpointed; attention outputs saved,
  and of the block's linear-layer matmuls (``mm``/``addmm``, counted in forward order from 1,
  afresh in each block's forward and in its recompute) the odd-numbered ones saved and the
  even-numbered ones recomputed, with everything else. More recompute and less memory than
  ``ops`` (a Llama block recomputes wk, wo and w3). On a bias-free model with SDPA attention
  (torchtitan's Llama) it is exactly torchtitan's policy, so exports and published runs map
  one to one. Measured like ``ops`` (its own traces and timings; ``advisor profile``
  measures it when asked, see profiled()); the what-if prices its recompute from the counted
  FLOPs of the policy.

This module is pure (no torch, no other profilers module): the trainer, the profiler, the
search and the CLI all read the settings through it.
"""

from __future__ import annotations

from dataclasses import dataclass

NONE, FULL, OPS = "none", "full", "ops"
OPS_HALF = "ops-half"
BLOCKS_PREFIX = "blocks:"
# Whole-model settings first (the profiler's priority order), then the selective ones.
WHOLE_MODEL: tuple[str, ...] = (NONE, FULL)
SELECTIVE_FORMS: tuple[str, ...] = (OPS, OPS_HALF, "blocks:K")
# The per-op policies: every block checkpointed, with a policy saying which outputs to keep.
PER_OP: tuple[str, ...] = (OPS, OPS_HALF)
FORMS_TEXT = "none, full, ops, ops-half or blocks:K (K of the model's repeated blocks)"


@dataclass(frozen=True, kw_only=True, slots=True)
class Checkpointing:
    """A parsed setting: ``kind`` is none | full | ops | ops-half | blocks; ``blocks`` is K for
    blocks."""

    kind: str
    blocks: int = 0

    @property
    def setting(self) -> str:
        return f"{BLOCKS_PREFIX}{self.blocks}" if self.kind == "blocks" else self.kind

    @property
    def recomputes(self) -> bool:
        return self.kind != NONE


def parse_checkpointing(value: str) -> Checkpointing:
    """Read one setting; ValueError (one line, naming the fix) for anything else."""
    if value in (NONE, FULL, *PER_OP):
        return Checkpointing(kind=value)
    if isinstance(value, str) and value.startswith(BLOCKS_PREFIX):
        text = value[len(BLOCKS_PREFIX) :]
        if not text.isdigit():
            raise ValueError(
                f"activation checkpointing {value!r}: K in blocks:K must be a whole number of "
                "blocks, e.g. blocks:2"
            )
        k = int(text)
        if k == 0:
            raise ValueError("activation checkpointing 'blocks:0' checkpoints no block: use 'none'")
        return Checkpointing(kind="blocks", blocks=k)
    raise ValueError(f"unknown activation_checkpointing {value!r}: choose one of {FORMS_TEXT}")


def check_for_layers(value: str, num_layers: int) -> Checkpointing:
    """Parse ``value`` and check it against a model with ``num_layers`` repeated blocks."""
    parsed = parse_checkpointing(value)
    if parsed.kind == "blocks" and parsed.blocks >= num_layers:
        if parsed.blocks == num_layers:
            raise ValueError(
                f"activation checkpointing '{value}' checkpoints all {num_layers} repeated "
                "blocks: use 'full'"
            )
        raise ValueError(
            f"activation checkpointing '{value}': the model has {num_layers} repeated blocks, "
            f"so K in blocks:K must be 1 to {num_layers - 1} (or use 'full')"
        )
    return parsed


def checkpointed_blocks(value: str, num_layers: int) -> tuple[int, ...]:
    """Indices (forward order) of the blocks ``value`` checkpoints in a model of ``num_layers``.

    ``blocks:K`` spreads K blocks evenly from the first: blocks floor(i·L/K) for i = 0..K-1
    (blocks:2 of 4 -> 0 and 2; blocks:3 of 4 -> 0, 1, 2). The last block is never among them
    for K < L: its backward runs first, while every other block's activations are still live,
    so recomputing it there saves nothing at the peak (traced on gpt-tiny and llama-tiny:
    checkpointing only the last of 4 blocks left the peak exactly at ``none``'s). With the
    first K-spread blocks the saved activations fall linearly in K.
    """
    parsed = check_for_layers(value, num_layers) if num_layers else parse_checkpointing(value)
    if parsed.kind == NONE:
        return ()
    if parsed.kind in (FULL, *PER_OP):
        return tuple(range(num_layers))
    k = parsed.blocks
    return tuple(i * num_layers // k for i in range(k))


def every_nth_block(value: str, num_layers: int) -> int | None:
    """N when ``blocks:K`` checkpoints one block in every N (K divides L), else None."""
    parsed = parse_checkpointing(value)
    if parsed.kind != "blocks" or not num_layers or num_layers % parsed.blocks:
        return None
    return num_layers // parsed.blocks


def block_fraction(value: str, num_layers: int) -> float | None:
    """K / L for ``blocks:K`` (0 for none, 1 for full); None for the per-op policies or an
    unknown L."""
    parsed = parse_checkpointing(value)
    if parsed.kind == NONE:
        return 0.0
    if parsed.kind == FULL:
        return 1.0
    if parsed.kind == "blocks" and num_layers > 0:
        return parsed.blocks / num_layers
    return None


def middle_blocks(num_layers: int) -> str | None:
    """The one ``blocks:K`` setting a profile measures (K = L // 2), None below two blocks."""
    return f"{BLOCKS_PREFIX}{num_layers // 2}" if num_layers >= 2 else None


def selectable(num_layers: int) -> tuple[str, ...]:
    """Every setting a model with ``num_layers`` repeated blocks can run, least recompute
    first within the selective ones: none, full, ops, ops-half, blocks:1 .. blocks:L-1."""
    if num_layers < 1:
        return (NONE,)
    return (
        *WHOLE_MODEL,
        *PER_OP,
        *(f"{BLOCKS_PREFIX}{k}" for k in range(1, num_layers)),
    )


def profiled(num_layers: int) -> tuple[str, ...]:
    """The settings a profile measures: none, full, ops and the middle blocks:K (the others
    are interpolated in K between none, blocks:L//2 and full)."""
    if num_layers < 1:
        return (NONE,)
    middle = middle_blocks(num_layers)
    return (*WHOLE_MODEL, OPS, *((middle,) if middle else ()))


def is_selective(value: str) -> bool:
    return parse_checkpointing(value).kind in (*PER_OP, "blocks")


def is_per_op(value: str) -> bool:
    """``ops`` or ``ops-half``: every block checkpointed under a selective per-op policy."""
    return parse_checkpointing(value).kind in PER_OP
