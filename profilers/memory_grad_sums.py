"""Autograd's in-place gradient sums, which a fake-tensor trace would otherwise miss.

When two paths of the backward graph send a gradient to the same input of a node (a tied
embedding and LM head, a residual stream, a tensor used twice), the engine sums them in that
input's buffer (``torch/csrc/autograd/input_buffer.cpp``, ``InputBuffer::accumulate``). For
ordinary tensors it sums *in place*, into whichever of the two it holds the only reference to,
and allocates nothing; only when both are shared does it compute ``old + new`` out of place. A
``FakeTensor`` is a tensor subclass, which the engine never sums in place, so a fake trace
allocates one extra gradient-sized buffer at every such sum. At a peak that falls on a sum (the
tied embedding's gradient summed at the very end of backward, when every gradient is live) the
trace read high by exactly that buffer: +49,152 B of 2.14 MB on the toy model in bf16 with
checkpointing at micro-batch 1, on an AVX2 host where the kernels' own scratch did not move the
real peak elsewhere.

``GradSumsInPlace`` is mixed into a tracing ``TorchDispatchMode`` (the MemTracker subclasses) and
replays the engine's choice: it recognises the sum (an ``aten.add.Tensor`` of one of the node's
just-returned gradients, seen through post-hooks on the graph's nodes) and, where the engine
would have summed in place, dispatches ``add_`` on the same operand instead. "Would have" is
the engine's own test, the tensor's reference count, read against the counts a tensor that is
certainly exclusive has under the same modes (``calibrate``, measured, because the dispatcher
and the modes hold references of their own).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

_ADD = torch.ops.aten.add.Tensor
_ADD_ = torch.ops.aten.add_.Tensor


class GradSumsInPlace:
    """Mixin for a ``TorchDispatchMode``, listed before it (``class T(GradSumsInPlace, Mode)``):
    its ``__torch_dispatch__`` rewrites an in-place sum, then hands every op to the mode's."""

    _sums_graph_task: int = -1
    _sums_node_outputs: frozenset[int] = frozenset()
    _sums_node: int | None = None
    _sums_exclusive: tuple[int, int] | None = None
    _sums_calibration: list[tuple[int, int]] | None = None
    grad_sums_in_place: int = 0

    def calibrate_grad_sums(self) -> None:
        """Learn the reference counts of an exclusive gradient under the active modes.

        Call inside the mode (``with tracker:``) and inside the ``FakeTensorMode``: a tiny
        backward whose one sum (``sin(h) + cos(h)`` sends two fresh gradients to ``h``) is
        exclusive on both sides. Without this the sums stay out of place (the trace is then
        high at a sum, never low).
        """
        self._sums_calibration = []
        try:
            weight = torch.empty(4, 3, requires_grad=True)
            hidden = torch.empty(2, 4) @ weight
            (hidden.sin() + hidden.cos()).sum().backward()
            observed = self._sums_calibration
        finally:
            self._sums_calibration = None
        if observed:
            self._sums_exclusive = (
                max(count for count, _ in observed),
                max(storage for _, storage in observed),
            )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        in_place = self._grad_sum_dispatch(func, types, args, kwargs)
        if in_place is not None:
            func, args = in_place
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _grad_sum_dispatch(
        self, func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None
    ) -> tuple[Any, tuple[Any, ...]] | None:
        """``(add_, (target, other))`` where the engine would sum in place, else None."""
        task = torch._C._current_graph_task_id()
        if task == -1:
            return None
        if task != self._sums_graph_task:
            self._sums_graph_task = task
            self._hook_graph(torch._C._current_autograd_node())
        if func is not _ADD or kwargs or len(args) != 2:
            return None
        if not all(issubclass(t, FakeTensor) for t in types):
            return None  # a real subclass (DTensor): the engine sums those out of place too
        old, new = args
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
            return None
        if id(new) not in self._sums_node_outputs or old is new:
            return None  # an add inside a backward formula, or a tensor summed with itself
        if _node_key() != self._sums_node:
            return None  # outputs recorded by a node that has finished: a formula's add
        if old.shape != new.shape or old.dtype != new.dtype:
            return None
        if self._sums_calibration is not None:
            self._sums_calibration.extend(_counts(t) for t in (old, new))
            return None
        for target, other in ((old, new), (new, old)):
            if self._exclusive(target):
                self.grad_sums_in_place += 1
                return _ADD_, (target, other)
        return None

    def _exclusive(self, tensor: torch.Tensor) -> bool:
        if self._sums_exclusive is None:
            return False
        count, storage = _counts(tensor)
        return count <= self._sums_exclusive[0] and storage <= self._sums_exclusive[1]

    def _hook_graph(self, root: Any) -> None:
        """A post-hook on every node of the graph being run, recording what each returned."""
        seen: set[int] = set()
        stack = [root]
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            node.register_hook(self._record_outputs)
            stack.extend(next_node for next_node, _ in node.next_functions)

    def _record_outputs(self, grad_inputs: Any, grad_outputs: Any) -> None:
        # Ids only: holding the tensors (or the node) would change reference counts and
        # lifetimes. The engine sums right after the hooks, with the same node current.
        self._sums_node = _node_key()
        self._sums_node_outputs = frozenset(
            id(g) for g in grad_inputs if isinstance(g, torch.Tensor)
        )


def _counts(tensor: torch.Tensor) -> tuple[int, int]:
    uses = tensor._use_count()  # type: ignore[attr-defined]
    return uses, torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


def _node_key() -> int | None:
    node = torch._C._current_autograd_node()
    return None if node is None else node._sequence_nr()
