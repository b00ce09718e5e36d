"""Eager attention's score traffic: the bytes its element-wise ops move over the T×T scores and
the FLOPs of the matmuls into and out of them, counted from the ops the step really runs."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from profilers.eager_attention import count_score_traffic, score_counter
from profilers.flops import ScoreTraffic, traffic_precision
from profilers.workload import StepSpec

B, H, T, D = 2, 4, 32, 8


def _attention(dtype: torch.dtype, *, mask: bool) -> dict[str, int]:
    """softmax(q·kᵀ·scale [+ mask]) · v, the softmax in fp32 as Hugging Face's eager path runs
    it, forward and backward, on fake tensors."""
    with FakeTensorMode():
        q, k, v = (torch.randn(B, H, T, D, dtype=dtype, requires_grad=True) for _ in range(3))
        bias = torch.zeros(B, 1, T, T, dtype=torch.float32)
        with score_counter(B, T) as counter:
            scores = torch.matmul(q, k.transpose(-2, -1)) * 0.125
            if mask:
                scores = scores + bias  # fp32 mask: the sum is fp32 (type promotion)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
            out = torch.matmul(probs, v)
            out.sum().backward()
    return counter.counts


def test_each_element_wise_op_over_the_scores_counts_what_it_reads_and_writes() -> None:
    n = B * H * T * T  # score elements
    counts = _attention(torch.bfloat16, mask=False)
    # forward: the scale (read 2, write 2), softmax's upcast (read 2, write 4), the softmax
    # (read 4, write 4), the cast back (read 4, write 2); backward: the cast's (read 2, write
    # 4), softmax's (read the gradient 4 and the output 4, write 4), the upcast's (read 4,
    # write 2), the scale's (read 2, write 2)
    assert counts["forward_bytes"] == n * (4 + 6 + 8 + 6)
    assert counts["backward_bytes"] == n * (6 + 12 + 6 + 4)
    # Q·Kᵀ and P·V forward, their four gradients backward: 2·B·H·T·T·D each
    matmul = 2 * B * H * T * T * D
    assert counts["forward_gemm_flops"] == 2 * matmul
    assert counts["backward_gemm_flops"] == 4 * matmul


def test_a_broadcast_mask_is_read_once_and_promotion_to_fp32_is_counted() -> None:
    plain = _attention(torch.bfloat16, mask=False)
    masked = _attention(torch.bfloat16, mask=True)
    # the add reads the bf16 scores (2 B) and the [B, 1, T, T] fp32 mask once (4 B per
    # element of one head: not its expanded size) and writes fp32 (4 B); softmax then needs
    # no upcast of its own (read 2, write 4): the mask's storage is all that is added
    assert masked["forward_bytes"] - plain["forward_bytes"] == B * T * T * 4
    assert masked["backward_bytes"] == plain["backward_bytes"]
    assert masked["forward_gemm_flops"] == plain["forward_gemm_flops"]


def test_tensors_that_are_not_scores_are_not_counted() -> None:
    """A [B, T, h] activation with h == T is one head's worth of elements: not scores."""
    with FakeTensorMode():
        x = torch.randn(1, T, T, requires_grad=True)
        w = torch.randn(T, T, requires_grad=True)
        with score_counter(1, T) as counter:
            (torch.relu(x @ w) * 2).sum().backward()
    assert counter.counts == dict.fromkeys(counter.counts, 0)


def test_fp16_moves_what_bf16_moves() -> None:
    assert traffic_precision("fp16") == traffic_precision("bf16") == "bf16"
    assert traffic_precision("fp32") == "fp32"


def _gemma2(layers: int) -> object:
    pytest.importorskip("transformers")
    from advisor.workload import AdvisorWorkload
    from tests.advisor.test_models import TINY_DECODER

    args = {**TINY_DECODER, "num_hidden_layers": layers, "head_dim": 16}
    return AdvisorWorkload("hf:gemma2", {**args, "max_position_embeddings": 128})


def _traffic(workload: object, spec: StepSpec) -> ScoreTraffic:
    return ScoreTraffic.from_dict(count_score_traffic(workload, spec))  # type: ignore[arg-type]


def test_gemma2_traffic_grows_with_the_layers_and_the_sequence_per_token() -> None:
    """Gemma 2 runs eager attention (soft-capping): per token, its score traffic is one share
    per layer, proportional to T; its matmuls' FLOPs are 2·2·H·T·d per token per layer."""
    spec = StepSpec(seq_len=32, micro_batch_size=1, precision="bf16")
    two = _traffic(_gemma2(2), spec)
    four = _traffic(_gemma2(4), spec)
    assert four.forward_bytes == pytest.approx(2 * two.forward_bytes)
    assert four.backward_bytes == pytest.approx(2 * two.backward_bytes)
    assert two.forward_gemm_flops == 2 * (2 * 2 * 2 * 32 * 16)
    assert two.backward_gemm_flops == 2 * two.forward_gemm_flops
    longer = _traffic(_gemma2(2), StepSpec(seq_len=64, micro_batch_size=1))
    fp32 = _traffic(_gemma2(2), StepSpec(seq_len=32, micro_batch_size=1))
    assert longer.forward_bytes == pytest.approx(2 * fp32.forward_bytes)
    # bf16 autocast moves 2-byte scores where it can, fp32 4-byte ones everywhere
    assert two.forward_bytes < fp32.forward_bytes


def test_the_flop_count_keeps_the_traffic_of_an_eager_model_only() -> None:
    from profilers.flops import FlopCount, count_step_flops

    count = count_step_flops(_gemma2(2), StepSpec(seq_len=32, micro_batch_size=1))  # type: ignore[arg-type]
    assert count.attention_as_matmuls()
    assert count.score_traffic is not None and set(count.score_traffic) == {"fp32", "bf16"}
    bf16 = ScoreTraffic.from_dict(count.score_traffic["bf16"])
    assert bf16.forward_bytes > 0 and bf16.backward_bytes > 0
    # the matmuls the traffic counts are the count's own bmm FLOPs
    counted = count.flops_by_op["none"]["aten.bmm"]
    assert bf16.forward_gemm_flops + bf16.backward_gemm_flops == pytest.approx(counted)
    assert FlopCount.from_dict(count.to_dict()) == count

    from advisor.workload import AdvisorWorkload
    from tests.advisor.test_models import TINY_DECODER

    llama = AdvisorWorkload("hf:llama", TINY_DECODER)
    sdpa = count_step_flops(llama, StepSpec(seq_len=32, micro_batch_size=1))
    assert not sdpa.attention_as_matmuls()
    assert sdpa.score_traffic is None
    assert "score_traffic" not in sdpa.to_dict()


def test_a_sink_column_beside_the_scores_still_counts_as_scores() -> None:
    """gpt-oss concatenates one attention-sink column per head before its softmax: the
    [B, H, T, T+1] tensors after it are scores too (a count of exact T×T ones missed them)."""
    n, wide = B * H * T * T, B * H * T * (T + 1)
    with FakeTensorMode():
        scores = torch.randn(B, H, T, T, requires_grad=True)
        sink = torch.zeros(B, H, T, 1)
        with score_counter(B, T) as counter:
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)
            loss = probs[..., :-1].sum()  # a view, then a sum reading T×T of it
    # cat: read the scores and the sinks, write T+1 columns; softmax: read and write them;
    # the sum reads the T×T view (its output, one number, is 4 B)
    assert counter.counts["forward_bytes"] == 4 * (n + B * H * T + wide) + 8 * wide + 4 * n + 4
    assert loss.shape == ()
