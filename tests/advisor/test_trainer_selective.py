"""Selective activation checkpointing in the trainer: which blocks, what is saved, same maths."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from advisor.trainer.step import AdvisorStep
from advisor.workload import AdvisorWorkload
from profilers.workload import StepSpec

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

GPT4 = AdvisorWorkload("gpt-tiny", {"n_layer": 4, "n_embd": 32, "n_head": 2, "block_size": 32})
LLAMA4 = AdvisorWorkload("llama-tiny", {"n_layer": 4})
SETTINGS = ("none", "full", "ops", "ops-half", "blocks:1", "blocks:2", "blocks:3")


def build(workload: AdvisorWorkload, checkpointing: str, seed: int = 0) -> AdvisorStep:
    torch.manual_seed(seed)
    spec = StepSpec(seq_len=16, micro_batch_size=2, activation_checkpointing=checkpointing)
    step = workload.build_step(spec, "cpu")
    assert isinstance(step, AdvisorStep)
    return step


def wrapped(step: AdvisorStep) -> list[int]:
    return [i for i, b in enumerate(step.adapter.blocks()) if isinstance(b, CheckpointWrapper)]


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("none", []),
        ("blocks:1", [0]),
        ("blocks:2", [0, 2]),
        ("blocks:3", [0, 1, 2]),
        ("full", [0, 1, 2, 3]),
        ("ops", [0, 1, 2, 3]),
        ("ops-half", [0, 1, 2, 3]),
    ],
)
def test_blocks_k_wraps_k_blocks_spread_evenly(setting: str, expected: list[int]) -> None:
    assert wrapped(build(GPT4, setting)) == expected


def test_blocks_k_out_of_range_is_refused_naming_the_fix() -> None:
    with pytest.raises(ValueError, match="use 'full'"):
        build(GPT4, "blocks:4")
    with pytest.raises(ValueError, match="1 to 3"):
        build(GPT4, "blocks:7")
    with pytest.raises(ValueError, match="use 'none'"):
        StepSpec(seq_len=16, activation_checkpointing="blocks:0")
    with pytest.raises(ValueError, match="blocks:K"):
        StepSpec(seq_len=16, activation_checkpointing="selective")


def saved_bytes(step: AdvisorStep) -> int:
    """Bytes autograd keeps for backward during one forward (what checkpointing trades)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    batch = step.synthetic_batches(torch.Generator().manual_seed(1))[0]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step.loss(batch)
    return sum(seen.values())


def test_recompute_saves_less_the_more_it_recomputes() -> None:
    saved = {s: saved_bytes(build(GPT4, s)) for s in ("none", "blocks:1", "blocks:2", "full")}
    # blocks:K: each checkpointed block keeps only its input (autograd's saved tensors).
    assert saved["none"] > saved["blocks:1"] > saved["blocks:2"] > saved["full"]


def op_counts(step: AdvisorStep) -> Counter[str]:
    """aten ops run by one forward+backward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: Counter[str] = Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            counts[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    batches = step.synthetic_batches(torch.Generator().manual_seed(1))
    with Count():
        step.forward_backward(batches)
    return counts


def test_ops_recomputes_the_cheap_ops_and_no_matmul() -> None:
    counts = {s: op_counts(build(GPT4, s)) for s in ("none", "ops", "full")}
    matmuls = ("mm", "addmm", "bmm", "_scaled_dot_product_flash_attention_for_cpu")
    for op in matmuls:
        assert counts["ops"][op] == counts["none"][op], op
    # full runs every block's forward again, matmuls included.
    assert sum(counts["full"][op] for op in matmuls) > sum(counts["none"][op] for op in matmuls)
    # ops recomputes the block's norms and activations (its non-matmul ops).
    cheap = [op for op in ("native_layer_norm", "gelu") if counts["none"][op]]
    assert cheap
    for op in cheap:
        assert counts["ops"][op] > counts["none"][op], op


@pytest.mark.parametrize(
    ("workload", "matmul", "per_block", "recomputed"),
    # gpt: c_attn, attn c_proj, c_fc, mlp c_proj (addmm: biases) -> the 2nd and 4th are not
    # saved; llama: wq wk wv wo w1 w3 w2 (mm) -> wk, wo, w3 not saved, as torchtitan's "op".
    # A recompute stops once every tensor backward needs is back (non-reentrant checkpoint),
    # so a block's last matmul, whose output no backward op reads, never runs again: full
    # recomputes 3 of gpt's 4 and 6 of llama's 7, ops-half 1 of gpt's (attn c_proj) and 3 of
    # llama's.
    [(GPT4, "addmm", 3, 1), (LLAMA4, "mm", 6, 3)],
    ids=["gpt", "llama"],
)
def test_ops_half_recomputes_every_second_matmul_of_a_block(
    workload: AdvisorWorkload, matmul: str, per_block: int, recomputed: int
) -> None:
    counts = {s: op_counts(build(workload, s)) for s in ("none", "ops", "ops-half", "full")}
    blocks = 4
    assert counts["ops"][matmul] == counts["none"][matmul]
    assert counts["ops-half"][matmul] == counts["none"][matmul] + blocks * recomputed
    assert counts["full"][matmul] == counts["none"][matmul] + blocks * per_block
    # attention's outputs are saved, as ops saves them
    sdpa = "_scaled_dot_product_flash_attention_for_cpu"
    assert counts["ops-half"][sdpa] == counts["none"][sdpa] < counts["full"][sdpa]


def test_ops_saves_a_mixture_of_experts_grouped_gemms_and_ops_half_recomputes_them() -> None:
    """Hugging Face runs a MoE layer's experts as grouped GEMMs: ``ops`` saves every matmul's
    output, those included; ``ops-half`` is torchtitan's ``op`` policy, which recomputes them."""
    pytest.importorskip("transformers")
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no grouped GEMM")
    moe = AdvisorWorkload(
        "hf:mixtral",
        {
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "vocab_size": 64,
            "num_local_experts": 4,
            "max_position_embeddings": 32,
        },
    )
    counts = {s: op_counts(build(moe, s)) for s in ("none", "ops", "ops-half", "full")}
    grouped = "_grouped_mm"
    assert counts["none"][grouped] > 0
    assert counts["ops"][grouped] == counts["none"][grouped]
    assert counts["full"][grouped] > counts["none"][grouped]
    assert counts["ops-half"][grouped] > counts["none"][grouped]


def test_ops_half_keeps_less_than_ops_and_more_than_full() -> None:
    """The step's traced peak (the selective outputs live inside the checkpoint's frame, where
    autograd's saved-tensor hooks do not see them)."""
    from profilers.memory import trace_step_memory

    for workload in (GPT4, LLAMA4):
        peak = {
            s: trace_step_memory(
                workload,
                StepSpec(seq_len=32, micro_batch_size=8, activation_checkpointing=s),
                target_device_type="cpu",
            ).forward_backward_peak_bytes
            for s in ("ops", "ops-half", "full")
        }
        assert peak["ops"] > peak["ops-half"] > peak["full"], workload.model


@pytest.mark.parametrize("workload", [GPT4, LLAMA4], ids=lambda w: w.model)
def test_every_setting_trains_with_the_plain_losses(workload: AdvisorWorkload) -> None:
    def losses(setting: str) -> list[float]:
        step = build(workload, setting)
        gen = torch.Generator().manual_seed(3)
        out = []
        for _ in range(3):
            loss, _ = step.step(step.synthetic_batches(gen))
            out.append(float(loss))
        return out

    plain = losses("none")
    for setting in SETTINGS[1:]:
        got = losses(setting)
        assert got == pytest.approx(plain, rel=1e-6, abs=0), setting


@pytest.mark.parametrize(
    ("value", "line"),
    [
        (
            "blocks:4",
            "error: gpt-tiny: activation checkpointing 'blocks:4' checkpoints all 4 repeated "
            "blocks: use 'full'",
        ),
        (
            "blocks:two",
            "error: Invalid value for '--activation-checkpointing': activation checkpointing "
            "'blocks:two': K in blocks:K must be a whole number of blocks, e.g. blocks:2",
        ),
    ],
)
def test_the_cli_refuses_a_bad_setting_in_one_line(tmp_path: Path, value: str, line: str) -> None:
    from click.testing import CliRunner

    from advisor.cli import main

    out = str(tmp_path / "run")
    args = ["train", "--model", "gpt-tiny", "--seq-len", "32", "--global-batch-size", "2"]
    args += ["--micro-batch-size", "2"]
    result = CliRunner().invoke(
        main, [*args, "--steps", "1", "--quiet", "--out", out, "--activation-checkpointing", value]
    )
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0].startswith(line)
    assert len(result.stderr.splitlines()) <= 2  # the line, and click's "see --help" hint


def test_a_plan_keeps_its_selective_setting() -> None:
    from strategies.config import TrainConfig

    for setting in ("ops", "ops-half", "blocks:3"):
        config = TrainConfig(model="gpt-tiny", activation_checkpointing=setting)
        assert TrainConfig.from_dict(config.to_dict()).activation_checkpointing == setting
