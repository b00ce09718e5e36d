"""The chunked language-model loss (``loss_chunks``): equal to the plain loss, gradients
included, for every model family; lighter in memory for a large vocabulary; unavailable, with
its reason, for a model that does not expose its output head."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from torch import nn

from advisor.cli import main
from advisor.models.objectives import IGNORE_INDEX, chunked_lm_loss, lm_loss
from advisor.workload import AdvisorWorkload
from profilers.workload import StepSpec
from strategies.config import ConfigError, TrainConfig
from tests.data.user_model import TinyLM

DATA = Path(__file__).resolve().parents[1] / "data"
USER_FILE = DATA / "user_model.py"
TOLERANCE = 1e-6


class HeadedLM(TinyLM):
    """A user model that exposes its output head as Hugging Face models do."""

    def get_output_embeddings(self) -> nn.Linear:
        return self.head


def headed_lm() -> nn.Module:
    return HeadedLM(64, 16, 2)


def loss_and_grads(
    model: str, args: dict[str, Any], loss_chunks: int, *, micro: int = 2, seq_len: int = 16
) -> tuple[float, dict[str, torch.Tensor]]:
    torch.manual_seed(0)  # the same initial weights for every chunking
    step = AdvisorWorkload(model, args).build_step(
        StepSpec(seq_len=seq_len, micro_batch_size=micro, loss_chunks=loss_chunks), "cpu"
    )
    batches = step.synthetic_batches(torch.Generator().manual_seed(1))
    loss = step.forward_backward(batches)
    grads = {}
    for name, p in step.model.named_parameters():
        assert p.grad is not None, name
        grads[name] = p.grad.clone()
    return float(loss), grads


def assert_equal_loss_and_grads(model: str, args: dict[str, Any], loss_chunks: int) -> None:
    plain_loss, plain = loss_and_grads(model, args, 1)
    loss, grads = loss_and_grads(model, args, loss_chunks)
    assert abs(loss - plain_loss) <= TOLERANCE * abs(plain_loss)
    assert grads.keys() == plain.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain[name], rtol=0, atol=TOLERANCE, msg=name)


@pytest.mark.parametrize(
    ("model", "args"),
    [
        ("gpt-tiny", {"vocab_size": 1000, "n_layer": 2}),  # tied head and embedding
        ("llama-tiny", {"n_layer": 2, "tie_weights": False}),  # a head of its own
        ("bert-tiny", {}),  # masked LM: labels on ~15% of the tokens, a tied head with a bias
        ("tests.advisor.test_chunked_loss:headed_lm", {}),  # a user model exposing its head
    ],
)
@pytest.mark.parametrize("loss_chunks", [2, 7])  # 7 does not divide the 32 tokens
def test_chunked_loss_and_gradients_equal_the_plain_ones(
    model: str, args: dict[str, Any], loss_chunks: int
) -> None:
    assert_equal_loss_and_grads(model, args, loss_chunks)


def test_bf16_autocast_matches_the_plain_loss_within_bf16_rounding() -> None:
    def run(chunks: int) -> tuple[float, dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        step = AdvisorWorkload("bert-tiny").build_step(
            StepSpec(seq_len=16, micro_batch_size=2, loss_chunks=chunks, precision="bf16"), "cpu"
        )
        loss = step.forward_backward(step.synthetic_batches(torch.Generator().manual_seed(1)))
        return float(loss), {n: p.grad.clone() for n, p in step.model.named_parameters()}  # type: ignore[union-attr]

    (plain_loss, plain), (loss, grads) = run(1), run(4)
    assert loss == pytest.approx(plain_loss, rel=1e-5)  # the softmax is fp32 in both
    for name, grad in grads.items():
        # bf16 keeps 8 bits of mantissa: the matmuls' sums round differently chunk by chunk
        assert float((grad - plain[name]).norm()) <= 1e-2 * float(plain[name].norm()), name


def test_hf_model_chunks_through_its_output_embeddings() -> None:
    pytest.importorskip("transformers")
    assert_equal_loss_and_grads(f"hf:{DATA / 'hf_tiny_gpt2'}", {}, 3)


def test_tied_embedding_receives_the_head_gradient() -> None:
    torch.manual_seed(0)
    step = AdvisorWorkload("gpt-tiny", {"n_layer": 1}).build_step(
        StepSpec(seq_len=16, micro_batch_size=2, loss_chunks=4), "cpu"
    )
    head, embedding = step.adapter.output_head(), step.adapter.module.get_submodule("wte")
    assert head is not None and head.weight is embedding.weight  # still tied
    # At most 32 of the 256 embedding rows are looked up: every other row's gradient comes
    # from the head alone, so it is non-zero only if the head's gradient reaches it.
    step.forward_backward(step.synthetic_batches())
    grad = embedding.weight.grad
    assert grad is not None and int((grad.abs().sum(dim=1) > 0).sum()) == grad.shape[0]


def test_mlm_mean_is_over_all_labelled_tokens_not_a_mean_of_chunk_means() -> None:
    torch.manual_seed(0)
    head = nn.Linear(8, 50)
    hidden = torch.randn(1, 12, 8, requires_grad=True)
    labels = torch.full((1, 12), IGNORE_INDEX)
    labels[0, 0] = 3  # one labelled token in the first half, five in the second
    labels[0, 7:] = torch.tensor([1, 4, 9, 16, 25])
    expected = lm_loss(head(hidden), labels)
    got = chunked_lm_loss(hidden, head, labels, 2)
    torch.testing.assert_close(got, expected, rtol=0, atol=TOLERANCE)
    halves = [
        F.cross_entropy(head(hidden[0, s]), labels[0, s], ignore_index=IGNORE_INDEX)
        for s in (slice(0, 6), slice(6, 12))
    ]
    assert abs(float(sum(halves) / 2) - float(expected)) > 1e-3  # what a mean of means gives


def test_chunked_loss_under_no_grad_and_autocast() -> None:
    torch.manual_seed(0)
    head = nn.Linear(8, 40)
    hidden = torch.randn(2, 6, 8)
    labels = torch.randint(40, (2, 6))
    with torch.no_grad():  # evaluation
        torch.testing.assert_close(
            chunked_lm_loss(hidden, head, labels, 3), lm_loss(head(hidden), labels)
        )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        chunked = chunked_lm_loss(hidden, head, labels, 3)
        plain = lm_loss(head(hidden), labels)
    assert chunked.dtype == plain.dtype == torch.float32  # the softmax in fp32, as plain
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-5)


def test_more_chunks_than_tokens_still_gives_the_plain_loss() -> None:
    head = nn.Linear(4, 10)
    hidden, labels = torch.randn(1, 3, 4), torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(
        chunked_lm_loss(hidden, head, labels, 8), lm_loss(head(hidden), labels)
    )


# -- memory ---------------------------------------------------------------------------------------


def test_traced_peak_falls_by_about_the_fp32_logits_and_their_gradients() -> None:
    """gpt-tiny with a 32000-token vocabulary, micro-batch 8 x 128 tokens, fp32.

    Plain, the loss holds its log-softmax (T·V·4 bytes, T = 1024 tokens, V = 32000) from forward
    to backward, and backward adds the gradients of the log-probabilities and of the logits
    (2·T·V·4) at once: 3·T·V·4 = 393 MB at the peak. With N chunks only one chunk's share of
    that exists at a time, and the head's weight gradient is summed over the chunks into one
    fp32 buffer (V·C·4, C = 256). Measured here: 600,354,012 B plain, 290,116,832 B with 8
    chunks: 310.2 MB less, between the fp32 logits plus their gradient
    (2·T·V·4·(1 - 1/N) = 229 MB) and the whole 3·T·V·4 = 393 MB.
    """
    from profilers.memory import trace_step_memory

    workload = AdvisorWorkload("gpt-tiny", {"vocab_size": 32000})
    b, t, v, n = 8, 128, 32000, 8

    def peak(chunks: int) -> int:
        spec = StepSpec(seq_len=t, micro_batch_size=b, loss_chunks=chunks)
        return trace_step_memory(workload, spec).peak_bytes

    saved = peak(1) - peak(n)
    logits = b * t * v * 4
    assert 2 * logits * (1 - 1 / n) <= saved <= 3 * logits


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_chunked_trace_matches_the_cpu_truth_with_and_without_checkpointing(
    checkpointing: str,
) -> None:
    """The profiler traces the chunked loss beside each checkpointing setting (phases_chunked):
    the fake trace of the custom autograd Function and the head's recompute inside a
    checkpointed model must read what the allocator holds, and never high. Measured here
    (gpt-tiny, V=8192, 2 blocks, micro-batch 4 x 128, fp32): -0.015% without checkpointing,
    -0.061% with full, 4 chunks."""
    from profilers.memory import measure_cpu_step_memory, trace_step_memory

    workload = AdvisorWorkload("gpt-tiny", {"vocab_size": 8192, "n_layer": 2, "n_embd": 64})
    spec = StepSpec(
        seq_len=128, micro_batch_size=4, activation_checkpointing=checkpointing, loss_chunks=4
    )
    trace, truth = trace_step_memory(workload, spec), measure_cpu_step_memory(workload, spec)
    for traced, measured in [
        (trace.forward_backward_peak_bytes, truth.forward_backward_peak_bytes),
        (trace.peak_bytes, truth.peak_bytes),
    ]:
        assert abs(traced / measured - 1) <= 0.01
        assert traced <= measured * 1.0001


# -- the knob -------------------------------------------------------------------------------------


def test_plan_key_round_trips_and_old_plans_read_as_the_plain_loss() -> None:
    config = TrainConfig(loss_chunks=4)
    assert TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))).loss_chunks == 4
    assert config.step_spec().loss_chunks == 4
    old = TrainConfig().to_dict()
    del old["loss_chunks"]
    assert TrainConfig.from_dict(old).loss_chunks == 1
    with pytest.raises(ConfigError, match="loss_chunks must be a positive integer"):
        TrainConfig(loss_chunks=0)


def test_model_without_an_output_head_reports_the_knob_unavailable() -> None:
    facts = AdvisorWorkload(f"{USER_FILE}:tiny_lm").facts()
    assert not facts.output_head
    assert "get_output_embeddings()" in facts.loss_chunking_unavailable()
    assert AdvisorWorkload("gpt-tiny").facts().loss_chunking_unavailable() == ""


def test_hf_model_scaling_its_logits_after_the_head_is_unavailable() -> None:
    pytest.importorskip("transformers")
    small = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128}
    small |= {"num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 500}
    facts = AdvisorWorkload("hf:cohere", small).facts()  # multiplies its logits by logit_scale
    assert "logit_scale" in facts.loss_chunking_unavailable()
    assert AdvisorWorkload("hf:granite", small).facts().loss_chunking_unavailable() == ""


def test_train_refuses_loss_chunks_without_an_output_head(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "train",
            *("--model", f"{USER_FILE}:tiny_lm", "--data", "synthetic", "--seq-len", "8"),
            *("--global-batch-size", "2", "--micro-batch-size", "2", "--steps", "1"),
            *("--loss-chunks", "2", "--quiet"),
            *("--out", str(tmp_path / "run")),
        ],
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--loss-chunks 2 is unavailable" in lines[0], result.output
    assert "--loss-chunks 1" in lines[0]


def test_train_with_loss_chunks_matches_the_plain_run(tmp_path: Path) -> None:
    def losses(chunks: int) -> list[float]:
        out = tmp_path / f"chunks{chunks}"
        result = CliRunner().invoke(
            main,
            [
                "train",
                *("--model", "gpt-tiny", "--model-arg", "n_layer=1", "--model-arg", "n_embd=32"),
                *("--data", "synthetic", "--seq-len", "16", "--global-batch-size", "2"),
                *("--micro-batch-size", "2"),
                *("--steps", "3", "--eval-every", "0", "--eval-batches", "1", "--quiet"),
                *("--loss-chunks", str(chunks), "--out", str(out)),
            ],
        )
        assert result.exit_code == 0, result.output
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in lines if r["kind"] == "train"]

    plain, chunked = losses(1), losses(3)
    assert len(plain) == 3
    assert chunked == pytest.approx(plain, rel=TOLERANCE)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
