"""State-space layers traced for a CUDA target as mamba_ssm's kernels hold memory, not as
transformers' PyTorch fallback does (profilers.ssm_kernels)."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import sys
from typing import Any

import pytest
import torch

import profilers.memory_tracing as memory_tracing
import profilers.ssm_kernels as ssm_kernels
from profilers.memory import trace_step_memory
from profilers.workload import StepSpec

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 64,
}
# One Mamba layer and one attention layer each (Jamba: Mamba-1; Bamba: Mamba-2).
JAMBA = {**TINY, "num_hidden_layers": 2, "attn_layer_period": 2, "attn_layer_offset": 1,
         "num_experts": 1, "num_experts_per_tok": 1}  # fmt: skip
BAMBA = {**TINY, "num_hidden_layers": 2, "attn_layer_indices": [1], "mamba_n_heads": 8,
         "mamba_d_head": 16, "mamba_d_state": 16, "mamba_chunk_size": 32}  # fmt: skip
# One gated-delta-rule (linear attention) layer and one attention layer (Qwen3.5: fla's kernel).
QWEN35 = {**TINY, "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
          "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
          "linear_value_head_dim": 16, "head_dim": 16}  # fmt: skip
KERNELS = {
    "jamba": {"mamba_ssm.selective_scan_fn", "causal_conv1d.causal_conv1d_fn"},
    "bamba": {"mamba_ssm.mamba_split_conv1d_scan_combined"},
    "qwen3_5_text": {"fla.chunk_gated_delta_rule", "causal_conv1d.causal_conv1d_fn"},
}


def _trace(model: str, args: dict[str, Any], monkeypatch: pytest.MonkeyPatch, kernels: bool):
    """A CUDA target's trace (bf16, sequence 64, micro-batch 2) and the kernels it ran."""
    pytest.importorskip("transformers")
    from advisor.workload import AdvisorWorkload

    used: list[str] = []
    original = ssm_kernels.ssm_cuda_kernels
    packages = frozenset({"mamba_ssm", "causal_conv1d", "fla"} if kernels else ())
    monkeypatch.setattr(memory_tracing, "kernels_expected", lambda: packages)
    monkeypatch.setattr(memory_tracing, "ssm_cuda_kernels", lambda **kw: original(used, **kw))
    spec = StepSpec(seq_len=64, micro_batch_size=2, precision="bf16")
    trace = trace_step_memory(AdvisorWorkload(f"hf:{model}", args), spec, target_device_type="cuda")
    return trace, {u.split(" (")[0] for u in used}


@pytest.mark.parametrize(
    ("model", "args"), [("jamba", JAMBA), ("bamba", BAMBA), ("qwen3_5_text", QWEN35)]
)
def test_a_cuda_targets_trace_runs_mamba_layers_as_their_kernels(
    model: str, args: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel, used = _trace(model, args, monkeypatch, kernels=True)
    assert used == KERNELS[model]
    fallback, none = _trace(model, args, monkeypatch, kernels=False)
    assert none == set()
    # The PyTorch path keeps per-position (Mamba-1) or per-chunk-pair (Mamba-2) fp32 states
    # the kernels recompute: far more activation memory for the same step.
    kept = kernel.forward_backward_breakdown.activations
    assert kept < 0.7 * fallback.forward_backward_breakdown.activations
    # the weights, gradients and optimizer state are the model's either way
    assert kernel.parameter_bytes == fallback.parameter_bytes
    assert kernel.optimizer_state_bytes == fallback.optimizer_state_bytes


def _saved(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[tuple[tuple[int, ...], Any]]]:
    """``fn``'s output and the (shape, dtype) of every tensor autograd saved for its backward,
    then its backward run (the gradients' shapes are checked by autograd)."""
    saved: list[tuple[tuple[int, ...], Any]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args, **kwargs)
    first = out[0] if isinstance(out, tuple) else out
    first.sum().backward()
    return out, saved


def test_the_selective_scan_keeps_what_mamba_ssms_kernel_keeps() -> None:
    """SelectiveScanFn with a gate z: u, delta, A, B, C, D, z, delta_bias, its chunk states x
    (batch, channels, ceil(L/2048), 2·state) in fp32 and the ungated output; B and C, passed
    transposed (as transformers does), are copied contiguous first."""
    b, d, n, length = 2, 8, 4, 4100  # three chunks of 2,048
    bf16 = {"dtype": torch.bfloat16, "requires_grad": True}
    u, delta, z = (torch.zeros(b, d, length, **bf16) for _ in range(3))
    A = torch.zeros(d, n, requires_grad=True)
    B_leaf, C_leaf = (torch.zeros(b, length, n, **bf16) for _ in range(2))
    B, C = B_leaf.transpose(1, 2), C_leaf.transpose(1, 2)
    D, bias = torch.zeros(d, requires_grad=True), torch.zeros(d, requires_grad=True)
    scan = ssm_kernels._selective_scan_fn(None)
    (out, last), saved = _saved(
        scan, u, delta, A, B, C, D=D, z=z, delta_bias=bias, delta_softplus=True,
        return_last_state=True,
    )  # fmt: skip
    assert out.shape == u.shape and out.dtype == torch.bfloat16
    assert last.shape == (b, d, n) and last.dtype == torch.float32
    chunks = math.ceil(length / ssm_kernels.SELECTIVE_SCAN_CHUNK)
    assert chunks == 3
    bf, f32 = torch.bfloat16, torch.float32
    assert saved == [
        ((b, d, length), bf),  # u
        ((b, d, length), bf),  # delta
        ((d, n), f32),  # A
        ((b, n, length), bf),  # B, made contiguous
        ((b, n, length), bf),  # C
        ((d,), f32),  # D
        ((b, d, length), bf),  # z
        ((d,), f32),  # delta_bias
        ((b, d, chunks, 2 * n), f32),  # x: the chunk states
        ((b, d, length), bf),  # the ungated output
    ]
    assert u.grad is not None and B_leaf.grad is not None and A.grad is not None


def test_the_fused_mamba2_op_keeps_what_mamba_ssms_kernel_keeps() -> None:
    """MambaSplitConv1dScanCombinedFn with the gated norm and the output projection: its input
    zxbcdt, the weights it was given, the scan's output out_x (before the norm), the norm's
    rstd in fp32 and, under autocast, the 16-bit copy of the projection's weight it used."""
    b, length, heads, p, n, groups, hidden = 2, 96, 4, 8, 16, 2, 24
    dim, conv_dim = heads * p, heads * p + 2 * groups * n
    zxbcdt = torch.zeros(b, length, 2 * dim + 2 * groups * n + heads, requires_grad=True)
    conv_w, conv_b = torch.zeros(conv_dim, 4, requires_grad=True), torch.zeros(conv_dim)
    dt_bias, A, D = (torch.zeros(heads, requires_grad=True) for _ in range(3))
    norm_w = torch.zeros(dim, requires_grad=True)
    proj_w = torch.zeros(hidden, dim, requires_grad=True)
    fused = ssm_kernels._split_conv1d_scan_combined(None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, saved = _saved(
            fused, zxbcdt.to(torch.bfloat16), conv_w, conv_b, dt_bias, A, D=D, chunk_size=32,
            rmsnorm_weight=norm_w, outproj_weight=proj_w, headdim=p, ngroups=groups,
            norm_before_gate=False,
        )  # fmt: skip
    assert out.shape == (b, length, hidden) and out.dtype == torch.bfloat16
    bf, f32 = torch.bfloat16, torch.float32
    assert saved == [
        ((b, length, zxbcdt.shape[-1]), bf),  # zxbcdt
        ((conv_dim, 4), f32),
        ((conv_dim,), f32),
        ((b, length, heads, p), bf),  # out_x
        ((heads,), f32),  # A
        ((heads,), f32),  # D
        ((heads,), f32),  # dt_bias
        ((dim,), f32),  # rmsnorm_weight
        ((groups * b * length,), f32),  # rstd
        ((hidden, dim), bf),  # the projection's weight, cast
    ]
    assert zxbcdt.grad is not None and proj_w.grad is not None and proj_w.grad.dtype == f32


def test_the_gated_delta_rule_keeps_what_flas_kernel_keeps() -> None:
    """ChunkGatedDeltaRuleFunction with the l2 norm in the kernel (as transformers calls it):
    the normalised q and k with their fp32 inverse norms, v, the chunk-local cumulative gate in
    fp32, beta and the solved WY matrix A (positions × value heads × 64, in k's dtype); q and k
    keep their own heads (grouped value heads are not repeated to them)."""
    b, length, key_heads, heads, kd, vd = 2, 100, 2, 4, 16, 8
    bf16 = {"dtype": torch.bfloat16, "requires_grad": True}
    q, k = (torch.zeros(b, length, key_heads, kd, **bf16) for _ in range(2))
    v = torch.zeros(b, length, heads, vd, **bf16)
    g = torch.zeros(b, length, heads, requires_grad=True)
    beta = torch.zeros(b, length, heads, **bf16)
    rule = ssm_kernels._chunk_gated_delta_rule(None)
    (out, final), saved = _saved(rule, q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    assert out.shape == v.shape and out.dtype == torch.bfloat16 and final is None
    bf, f32 = torch.bfloat16, torch.float32
    assert saved == [
        ((b, length, key_heads, kd), bf),  # q, normalised
        ((b, length, key_heads), f32),  # its inverse norms
        ((b, length, key_heads, kd), bf),  # k, normalised
        ((b, length, key_heads), f32),
        ((b, length, heads, vd), bf),  # v
        ((b, length, heads), f32),  # the cumulative gate
        ((b, length, heads), bf),  # beta
        ((b, length, heads, ssm_kernels.GATED_DELTA_CHUNK), bf),  # A
    ]
    assert q.grad is not None and g.grad is not None and beta.grad is not None


def test_the_gated_delta_rule_saves_copies_of_views_as_flas_input_guard_makes_them() -> None:
    """transformers passes q, k and v as views of the convolution's transposed output; fla's
    input_guard makes them contiguous, so the v kept for backward is a copy the size of v, not
    a view keeping the whole (q, k, v) output alive."""
    b, length, key_heads, heads, kd, vd = 2, 64, 2, 4, 16, 8
    conv_dim = 2 * key_heads * kd + heads * vd
    conv_out = torch.zeros(b, conv_dim, length, dtype=torch.bfloat16, requires_grad=True)
    mixed = conv_out.transpose(1, 2)
    q, k, v = torch.split(mixed, [key_heads * kd, key_heads * kd, heads * vd], dim=-1)
    q, k = (t.reshape(b, length, key_heads, kd) for t in (q, k))
    v = v.reshape(b, length, heads, vd)
    assert v.untyped_storage().nbytes() == conv_out.untyped_storage().nbytes()
    g = torch.zeros(b, length, heads, requires_grad=True)
    beta = torch.zeros(b, length, heads, dtype=torch.bfloat16, requires_grad=True)
    rule = ssm_kernels._chunk_gated_delta_rule(None)
    stored: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        stored.append(t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, _ = rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    out.sum().backward()
    assert stored[4] == v.numel() * 2  # v: its own bf16 copy
    assert conv_out.untyped_storage().nbytes() not in stored
    assert conv_out.grad is not None


def test_the_modeling_modules_get_their_functions_back(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    _trace("bamba", BAMBA, monkeypatch, kernels=True)
    module = sys.modules["transformers.models.bamba.modeling_bamba"]
    assert module.mamba2_split_conv1d_scan_combined.__module__ == module.__name__
    assert module.causal_conv1d_fn.__module__ == module.__name__


def test_the_kernels_are_assumed_off_a_gpu_and_looked_for_on_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    every = frozenset({"mamba_ssm", "causal_conv1d", "fla"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ssm_kernels.kernels_expected() == every  # planning a GPU from a host without one
    # (mamba_ssm, causal_conv1d and fla: flash-linear-attention)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert not ssm_kernels.kernels_expected()  # a GPU without mamba-ssm runs the fallback
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert ssm_kernels.kernels_expected() == every
    # Each package on its own: transformers falls back per function.
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: object() if name == "mamba_ssm" else None
    )
    assert ssm_kernels.kernels_expected() == {"mamba_ssm"}


def test_a_gpu_with_mamba_ssm_but_not_causal_conv1d_traces_the_scan_kernel_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Jamba's scan calls mamba_ssm, its convolution causal_conv1d: with only the first
    installed, the trace fakes the scan and runs transformers' PyTorch convolution."""
    pytest.importorskip("transformers")
    from advisor.workload import AdvisorWorkload

    used: list[str] = []
    original = ssm_kernels.ssm_cuda_kernels
    monkeypatch.setattr(memory_tracing, "kernels_expected", lambda: frozenset({"mamba_ssm"}))
    monkeypatch.setattr(memory_tracing, "ssm_cuda_kernels", lambda **kw: original(used, **kw))
    spec = StepSpec(seq_len=64, micro_batch_size=2, precision="bf16")
    trace_step_memory(AdvisorWorkload("hf:jamba", JAMBA), spec, target_device_type="cuda")
    assert {u.split(" (")[0] for u in used} == {"mamba_ssm.selective_scan_fn"}


def test_a_mamba_models_facts_name_its_kernels_and_keep_them_in_the_profile() -> None:
    pytest.importorskip("transformers")
    import json

    from advisor.workload import AdvisorWorkload
    from profilers.workload import ModelFacts

    facts = AdvisorWorkload("hf:jamba", JAMBA).facts()
    assert facts.state_space_kernels == (
        "causal_conv1d.causal_conv1d_fn",
        "mamba_ssm.selective_scan_fn",
    )
    assert ModelFacts.from_dict(json.loads(json.dumps(facts.to_dict()))) == facts
    plain = AdvisorWorkload("gpt-tiny", {}).facts()
    assert plain.state_space_kernels == () and "state_space_kernels" not in plain.to_dict()


def test_an_fsdp_ranks_trace_runs_them_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-rank trace (fake process group, FSDP over 2) enters the same CUDA target."""
    pytest.importorskip("transformers")
    from advisor.workload import AdvisorWorkload
    from profilers.memory_distributed import trace_in_this_process

    spec = StepSpec(
        seq_len=64, micro_batch_size=2, precision="bf16", parallelism="fsdp", world_size=2
    )
    original = ssm_kernels.ssm_cuda_kernels
    kept = {}
    for kernels in (True, False):
        used: list[str] = []
        packages = frozenset({"mamba_ssm", "causal_conv1d"} if kernels else ())
        monkeypatch.setattr(memory_tracing, "kernels_expected", lambda p=packages: p)
        monkeypatch.setattr(
            memory_tracing, "ssm_cuda_kernels", lambda u=used, **kw: original(u, **kw)
        )
        workload = AdvisorWorkload("hf:bamba", BAMBA)
        (trace,) = trace_in_this_process(workload, [spec], "cuda")
        assert bool(used) == kernels
        kept[kernels] = trace.forward_backward_breakdown.activations
    assert kept[True] < 0.7 * kept[False]


def _count(model: str, args: dict[str, Any], *, kernels: bool = True) -> Any:
    """The FLOP count of a tiny hybrid at sequence 64, micro-batch 2, with the fake kernels or
    (``kernels`` False) transformers' PyTorch path."""
    pytest.importorskip("transformers")
    from advisor.workload import AdvisorWorkload
    from profilers.flops import count_step_flops

    with pytest.MonkeyPatch.context() as patch:
        if not kernels:
            patch.setattr(ssm_kernels, "ssm_cuda_kernels", lambda: contextlib.nullcontext())
        spec = StepSpec(seq_len=64, micro_batch_size=2)
        return count_step_flops(AdvisorWorkload(f"hf:{model}", args), spec)


def test_a_flop_count_runs_the_kernels_and_counts_their_matmul_work() -> None:
    """Jamba's Mamba-1 layer (128 channels, state 16, convolution width 4): the scan's
    contraction with C, 2·N per channel and position forward, its gradients and its states
    recomputed from the chunk states 3× that in backward; the depthwise convolution 2·k per
    channel forward, twice that backward. No per-position matmul (the PyTorch loop's bmm)."""
    count = _count("jamba", JAMBA)
    by_op = count.flops_by_op["none"]
    channels, state, width = 128, 16, 4
    assert by_op["mamba_ssm.selective_scan_fn"] == 2 * channels * state
    assert by_op["mamba_ssm.selective_scan_fn_backward"] == 3 * 2 * channels * state
    assert by_op["aten.convolution"] == 2 * channels * width
    assert by_op["aten.convolution_backward"] == 2 * by_op["aten.convolution"]
    assert "aten.bmm" not in by_op
    scan = count.state_space_kernels["mamba_ssm.selective_scan_fn"]
    assert scan["calls"] == 1 and scan["forward_flops"] == 2 * channels * state
    # reads u, delta, z, B, C, writes the output and the gated one; per token
    assert scan["forward_elements"] == 5 * channels + 2 * state
    assert set(count.state_space_kernels) == KERNELS["jamba"]
    # A recompute runs the kernels again: full counts one more forward of each.
    full = count.flops_by_op["full"]
    assert full["mamba_ssm.selective_scan_fn"] == 2 * by_op["mamba_ssm.selective_scan_fn"]


def test_the_fused_mamba2_kernel_counts_its_projection_as_the_pytorch_path_does() -> None:
    """The fused kernel runs the output projection inside it: its forward and its gradients
    count what the PyTorch path's separate linear layer counted; the SSD's chunked matmuls per
    token: C·Bᵀ per group (2·Q·N) and, per head, its product with x (2·Q·P), the chunk states
    (2·N·P) and their readout (2·N·P); Q = 32, N = 16, 8 heads × P = 16."""
    kernel, torch_path = _count("bamba", BAMBA), _count("bamba", BAMBA, kernels=False)
    by_op, before = kernel.flops_by_op["none"], torch_path.flops_by_op["none"]
    assert by_op["aten.mm"] == before["aten.mm"]
    q, n, dim = 32, 16, 8 * 16
    ssd = 2 * q * n + dim * (2 * q + 4 * n)
    assert by_op["mamba_ssm.mamba_split_conv1d_scan_combined"] == ssd
    conv = 2 * (dim + 2 * n) * 4
    assert by_op["aten.convolution"] == conv and by_op["aten.convolution_backward"] == 2 * conv
    assert by_op["mamba_ssm.mamba_split_conv1d_scan_combined_backward"] == (
        2 * ssd + 2 * q * n + 2 * dim * n + conv
    )
    assert "aten.bmm" in before and "aten.bmm" not in by_op  # the PyTorch path's einsums
    assert torch_path.state_space_kernels is None


def test_the_kernels_record_extends_in_depth_and_round_trips() -> None:
    """A deep pure Mamba-2 stack is counted on two shallow copies and extended: one call per
    layer, the per-token work growing with the layers; the record survives profile.json."""
    import json

    from profilers.flops import FlopCount

    args = {**TINY, "num_hidden_layers": 8, "num_heads": 8, "head_dim": 16, "state_size": 16,
            "n_groups": 1, "chunk_size": 32, "expand": 2}  # fmt: skip
    args = {k: v for k, v in args.items() if k not in ("num_key_value_heads", "intermediate_size",
            "num_attention_heads", "max_position_embeddings")}  # fmt: skip
    count = _count("mamba2", args)
    assert count.scaled_from_blocks is not None
    (record,) = count.state_space_kernels.values()
    assert record["calls"] == 8
    shallow = _count("mamba2", {**args, "num_hidden_layers": 2})
    (two,) = shallow.state_space_kernels.values()
    assert record["forward_elements"] == pytest.approx(4 * two["forward_elements"])
    again = FlopCount.from_dict(json.loads(json.dumps(count.to_dict())))
    assert again == count


def test_the_gated_delta_rule_counts_fla_s_chunked_matmuls() -> None:
    """Per token and value head (chunk c = 64, key and value width 16): A = β·K·Kᵀ (2·c·K), its
    triangular solve (2·c²/3), w and u (2·c·K, 2·c·V), the state's readout and update (4·K·V),
    the output's inter-chunk (2·K·V) and intra-chunk (2·c·K + 2·c·V) parts; backward twice that
    plus what it recomputes (w, u and the states). No per-chunk matmul of the PyTorch loop."""
    count = _count("qwen3_5_text", QWEN35)
    by_op = count.flops_by_op["none"]
    heads, d, c = 4, 16, ssm_kernels.GATED_DELTA_CHUNK
    forward = heads * (6 * c * d + 4 * c * d + 6 * d * d + 2 * c * c / 3)
    assert by_op["fla.chunk_gated_delta_rule"] == pytest.approx(forward)
    recomputed = heads * (2 * c * d + 2 * c * d + 4 * d * d)
    assert by_op["fla.chunk_gated_delta_rule_backward"] == pytest.approx(2 * forward + recomputed)
    assert "aten.bmm" not in by_op
    assert count.state_space_kernels["fla.chunk_gated_delta_rule"]["calls"] == 1
