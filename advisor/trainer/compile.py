"""torch.compile in the training step: which modules are compiled, and what a failure says.

How (:func:`apply_compile`): each repeated block is compiled in place with
``nn.Module.compile()``, after activation checkpointing wraps it and before DDP or FSDP2 wrap
the model (:func:`advisor.trainer.step.prepare_module` owns that order). This is torchtitan's
recipe (``apply_compile`` in its Llama parallelize: one ``torch.compile`` per TransformerBlock,
then ``fully_shard``), chosen over compiling the whole model for three reasons:

* the blocks are identical, so dynamo compiles one graph and reuses it for every block (its
  cache is keyed by the code object; the parameters are guarded as inputs): compile time does
  not grow with depth;
* it composes with the wrappers without graph breaks at their seams: a whole-model compile of a
  DDP module runs through DDPOptimizer, which splits the graph at every gradient bucket
  (``torch._dynamo.backends.distributed``), and FSDP2's per-block pre/post-forward hooks
  (all-gather, reshard) would sit inside the compiled region; compiled per block, the
  collectives stay in eager code between the compiled blocks;
* a checkpoint-wrapped block (``full``, ``blocks:K``, the ``ops`` selective policy) is compiled
  with its checkpoint: dynamo traces ``torch.utils.checkpoint`` as a higher-order op, so the
  recompute is compiled too.

``nn.Module.compile()`` (not ``torch.compile(module)``) keeps the module in its parent: state
dict keys do not gain ``_orig_mod.``, so checkpoints load with or without compile. Embedding,
head and loss stay eager. A model without repeated blocks is compiled whole (one module).

Compilation is lazy: a model dynamo or inductor cannot compile fails in its first step. The
trainer turns that into one line (:func:`compile_failure`) naming ``--no-compile``.
"""

from __future__ import annotations

from torch import nn

from advisor.models.adapter import ModelAdapter
from profilers.compile_records import compile_unavailable

__all__ = [
    "apply_compile",
    "check_compile_available",
    "compile_failure",
    "compile_problem",
    "compile_unavailable",
]


def apply_compile(adapter: ModelAdapter) -> None:
    """Compile each repeated block in place (the whole model when it has none)."""
    blocks: list[nn.Module] = list(adapter.blocks()) or [adapter.module]
    for block in blocks:
        block.compile()


def compile_failure(exc: BaseException) -> str | None:
    """One line describing ``exc`` when dynamo or inductor raised it (a model that cannot be
    compiled, a C++/Triton build that failed), else None (not a compile problem)."""
    from advisor.errors import one_line

    seen: BaseException | None = exc
    while seen is not None:
        module = type(seen).__module__ or ""
        if module.startswith(("torch._dynamo", "torch._inductor")):
            text = one_line(exc)
            return text if len(text) <= 300 else text[:297] + "..."
        seen = seen.__cause__ or seen.__context__
    return None


def check_compile_available(device_type: str) -> None:
    """Refuse ``--compile`` where it cannot run (no C++ compiler, no triton): one line."""
    from advisor.errors import UsageProblem

    why = compile_unavailable(device_type)
    if why:
        raise UsageProblem(f"--compile is unavailable: {why}; or use --no-compile")


def compile_problem(model: str, exc: BaseException) -> Exception | None:
    """The one-line error to raise instead of ``exc`` when it is a compile failure."""
    from advisor.errors import UsageProblem

    why = compile_failure(exc)
    if why is None:
        return None
    return UsageProblem(f"torch.compile failed on {model} ({why}): use --no-compile")
