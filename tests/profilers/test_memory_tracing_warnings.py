"""A trace prints none of torch's module-tracking warnings that say nothing about its numbers."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

from profilers.memory import trace_step_memory
from profilers.memory_tracing import module_tracking_quiet
from profilers.workload import StepSpec


class _Func(nn.Module):
    """A function wrapped as a module outside the model, as Hugging Face's hub kernels wrap
    ``apply_rotary_pos_emb`` and ``rotate_half`` (``kernels``' ``Func``): two such instances,
    one calling the other, share the name ModTracker gives them, which it then sees entered
    again before its forward ended."""

    def __init__(self, inner: nn.Module | None = None) -> None:
        super().__init__()
        self.inner = [inner]  # a plain attribute: not a child, as a global wrapper is not

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = self.inner[0]
        return (inner(x) if inner is not None else x) * 2


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.func = [_Func(_Func())]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.func[0](self.linear(x))


def _step(model: nn.Module) -> None:
    with MemTracker() as tracker:
        tracker.track_external(model)
        model(torch.randn(2, 4, requires_grad=True)).sum().backward()


def test_a_module_entered_again_warns_without_the_context_and_not_within_it() -> None:
    model = _Model()
    with pytest.warns(UserWarning, match="module hierarchy tracking"):
        _step(model)
    formatwarning = warnings.formatwarning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with module_tracking_quiet():
            _step(model)
    # ModTracker replaces the formatter before it warns; the context puts it back.
    assert warnings.formatwarning is formatwarning


# Bamba: a Mamba hybrid (its Mamba layers build their activation module in every forward).
MAMBA = {"mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_chunk_size": 32}


@pytest.mark.parametrize(("model", "extra"), [("qwen2", {}), ("bamba", MAMBA)])
def test_a_hugging_face_model_is_traced_without_a_warning(
    model: str, extra: dict[str, int]
) -> None:
    pytest.importorskip("transformers")
    from advisor.workload import AdvisorWorkload

    args = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "max_position_embeddings": 64,
        **extra,
    }
    spec = StepSpec(seq_len=32, micro_batch_size=2, precision="bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        trace = trace_step_memory(AdvisorWorkload(f"hf:{model}", args), spec)
    assert trace.peak_bytes > 0


class _Gated(nn.Module):
    """Builds a module in every forward, as transformers' ``ACT2FN["silu"]`` does in Mamba
    layers: it is gone before backward runs its hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.SiLU()(self.linear(x))


def test_a_module_gone_before_backward_warns_without_the_context_and_not_within_it() -> None:
    with pytest.warns(UserWarning, match="Module is None"):
        _step(_Gated())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with module_tracking_quiet():
            _step(_Gated())
