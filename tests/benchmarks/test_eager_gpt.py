"""benchmarks/models/eager_gpt.py: the gpt-small preset with its attention written out by hand.
The GPU check trains it beside the preset, so the two must be the same model but for how the
attention runs."""

from __future__ import annotations

import torch

from advisor.models.gpt import GPT, GPTConfig
from benchmarks.models.eager_gpt import eager_gpt

ARGS = {"n_layer": 2, "n_head": 4, "n_embd": 32, "vocab_size": 64, "block_size": 16, "bias": False}


def test_it_computes_what_the_sdpa_preset_computes_with_the_same_weights() -> None:
    torch.manual_seed(0)
    eager = eager_gpt(**ARGS)
    preset = GPT(GPTConfig(**ARGS))  # type: ignore[arg-type]
    preset.load_state_dict(eager.state_dict())
    assert sum(p.numel() for p in eager.parameters()) == sum(p.numel() for p in preset.parameters())
    ids = torch.randint(0, 64, (3, 16))
    torch.testing.assert_close(eager(ids), preset(ids), rtol=1e-5, atol=1e-5)
    shorter = ids[:, :9]  # the causal mask is cut to the sequence
    torch.testing.assert_close(eager(shorter), preset(shorter), rtol=1e-5, atol=1e-5)


def test_its_flop_count_shows_attention_as_matmuls_with_its_score_traffic() -> None:
    from advisor.workload import AdvisorWorkload
    from profilers.flops import count_step_flops
    from profilers.workload import StepSpec

    workload = AdvisorWorkload("benchmarks/models/eager_gpt.py:eager_gpt", ARGS)
    count = count_step_flops(workload, StepSpec(seq_len=16, micro_batch_size=1))
    assert count.attention_as_matmuls() and count.score_traffic is not None
    # bf16 on a GPU: CUDA autocast runs its softmax (no dtype given) in fp32, so the
    # upcast and the cast back for P·V move more than fp32's plain ops do
    assert (
        count.score_traffic["bf16"]["forward_bytes"] > count.score_traffic["fp32"]["forward_bytes"]
    )


def test_the_predicted_pair_is_the_pair_the_gpu_check_trains() -> None:
    """benchmarks/eager_attention.py writes down the eager/SDPA ratio before a GPU runs the pair
    in scripts/gpu_check.sh: the two must describe the same runs."""
    import re
    from pathlib import Path

    from benchmarks import eager_attention as ea

    script = (Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh").read_text()
    body = script[script.index("attn() {") : script.index("\n}\n", script.index("attn() {"))]
    model_args = dict(re.findall(r"--model-arg (\w+)=(\S+)", body))
    assert model_args == {k: str(v).lower() for k, v in ea.PAIR_ARGS.items()}
    names = "seq-len|micro-batch-size|grad-accum-steps|precision|activation-checkpointing"
    flags = dict(re.findall(rf"--({names}) (\S+)", body))
    assert flags == {k.replace("_", "-"): str(v) for k, v in ea.PAIR_RUN.items()}
    for model in ea.PAIR_MODELS.values():
        assert re.search(rf"^\s*attn \S+ {re.escape(model)}$", script, re.MULTILINE)
