"""benchmarks/models/moe_gpt.py: the gpt-small preset with a mixture of experts for every MLP,
run as transformers runs MoE layers. The GPU check trains it; its prediction is written down."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from benchmarks.models.moe_gpt import moe_gpt

pytestmark = pytest.mark.skipif(
    not hasattr(torch, "_grouped_mm"), reason="this torch has no grouped GEMM"
)

ARGS: dict[str, Any] = {
    "n_layer": 2,
    "n_head": 4,
    "n_embd": 32,
    "vocab_size": 64,
    "block_size": 16,
    "bias": False,
    "n_experts": 4,
    "top_k": 2,
}


def test_each_token_gets_the_weighted_sum_of_its_top_k_experts() -> None:
    torch.manual_seed(0)
    model = moe_gpt(**ARGS)
    moe = model.blocks[0].mlp
    x = torch.randn(2, 16, 32)
    out = moe(x)
    flat = x.reshape(-1, 32)
    probs = F.softmax(flat @ moe.router.weight.T, dim=-1)
    expected = torch.zeros_like(flat)
    for i, token in enumerate(flat):
        weights, chosen = torch.topk(probs[i], 2)
        for w, e in zip(weights / weights.sum(), chosen, strict=True):
            hidden = F.gelu(token @ moe.up[e].T, approximate="tanh")
            expected[i] += w * (hidden @ moe.down[e].T)
    torch.testing.assert_close(out.reshape(-1, 32), expected, rtol=1e-4, atol=1e-5)


def test_its_profile_records_the_experts_and_the_what_if_prices_them() -> None:
    from advisor.workload import AdvisorWorkload
    from profilers.flops import count_step_flops
    from profilers.hardware import lookup_target
    from profilers.workload import StepSpec
    from strategies.whatif import RooflineTime, time_source

    workload = AdvisorWorkload("benchmarks/models/moe_gpt.py:moe_gpt", ARGS)
    count = count_step_flops(workload, StepSpec(seq_len=16, micro_batch_size=2))
    assert count.expert_gemms == [
        {"experts": 4.0, "k": 32.0, "n": 128.0, "rows_per_token": 2.0, "calls": 2.0},
        {"experts": 4.0, "k": 128.0, "n": 32.0, "rows_per_token": 2.0, "calls": 2.0},
    ]
    source = time_source(lookup_target("h200"), workload.facts(), 16, count)
    assert isinstance(source, RooflineTime) and len(source.shape.experts) == 2


def test_a_bf16_training_step_runs_its_experts_in_bf16() -> None:
    """The rows are cast to the fp32 weights' dtype before each grouped GEMM, as transformers
    does: only the trainer's autocast rule for the op makes them bf16."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from advisor.workload import AdvisorWorkload
    from profilers.workload import StepSpec

    seen: list[torch.dtype] = []

    class Dtypes(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):  # type: ignore[no-untyped-def]
            if func is torch.ops.aten._grouped_mm.default:
                seen.append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    workload = AdvisorWorkload("benchmarks/models/moe_gpt.py:moe_gpt", ARGS)
    step = workload.build_step(StepSpec(seq_len=16, micro_batch_size=2, precision="bf16"), "cpu")
    batches = step.synthetic_batches()
    with Dtypes():
        loss, _ = step.step(batches)
    assert torch.isfinite(loss)
    assert len(seen) == 2 * 2 * 3 and set(seen) == {torch.bfloat16}


def test_the_predicted_run_is_the_run_the_gpu_check_trains() -> None:
    """benchmarks/moe_experts.py writes down the step before a GPU runs the moe stage of
    scripts/gpu_check.sh: the two must describe the same run."""
    import re
    from pathlib import Path

    from benchmarks import moe_experts as me

    script = (Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh").read_text()
    body = script[script.index("moe() {") : script.index("\n}\n", script.index("moe() {"))]
    model_args = dict(re.findall(r"--model-arg (\w+)=(\S+)", body))
    assert model_args == {k: str(v).lower() for k, v in me.GPU_RUN_ARGS.items()}
    names = "seq-len|micro-batch-size|grad-accum-steps|precision|activation-checkpointing"
    flags = dict(re.findall(rf"--({names}) (\S+)", body))
    assert flags == {k.replace("_", "-"): str(v) for k, v in me.GPU_RUN.items()}
    assert f"--model {me.GPU_RUN_MODEL} " in body
    assert re.search(r"^\s*moe \S+$", script, re.MULTILINE)
