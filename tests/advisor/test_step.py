"""The one training step (AdvisorStep), built through AdvisorWorkload as trainer and probes do."""

from __future__ import annotations

import itertools
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from advisor.models.objectives import IGNORE_INDEX
from advisor.trainer.step import AdvisorStep
from advisor.workload import AdvisorWorkload
from profilers.workload import Batch, StepSpec, TrainStep, Workload

REPO = Path(__file__).resolve().parents[2]
TINY_GPT = AdvisorWorkload("gpt-tiny", {"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": 32})


def build(spec: StepSpec, workload: AdvisorWorkload = TINY_GPT, seed: int = 0) -> AdvisorStep:
    torch.manual_seed(seed)  # same initial weights for every step built with the same seed
    return workload.build_step(spec, "cpu")


def grads(step: AdvisorStep) -> list[torch.Tensor]:
    return [p.grad.clone() for p in step.model.parameters() if p.grad is not None]


def test_workload_satisfies_the_probe_protocols_and_pickles() -> None:
    workload = pickle.loads(pickle.dumps(TINY_GPT))
    assert workload == TINY_GPT
    assert isinstance(workload, Workload)
    assert workload.facts().num_layers == 2
    assert isinstance(build(StepSpec(seq_len=8)), TrainStep)


def test_workload_module_imports_on_its_own() -> None:
    # A probe's child process unpickles an AdvisorWorkload: advisor.workload is its first import.
    result = subprocess.run(
        [sys.executable, "-c", "import advisor.workload"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr.strip().splitlines()[-1:]


@pytest.mark.parametrize(
    ("precision", "checkpointing", "accum"),
    list(itertools.product(("fp32", "bf16", "fp16"), ("none", "full"), (1, 2))),
)
def test_every_step_variant_learns_a_fixed_batch(
    precision: str, checkpointing: str, accum: int
) -> None:
    spec = StepSpec(
        seq_len=16,
        micro_batch_size=2,
        grad_accum_steps=accum,
        precision=precision,
        activation_checkpointing=checkpointing,
        lr=1e-2,
    )
    step = build(spec)
    batches = step.synthetic_batches(torch.Generator().manual_seed(1))
    assert len(batches) == accum
    losses = []
    for _ in range(5):
        loss, stats = step.step(batches)
        assert loss.dtype == torch.float32 and torch.isfinite(stats.grad_norm)
        if precision == "fp16":
            assert stats.skipped is not None and not bool(stats.skipped)
        else:
            assert stats.skipped is None
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3, losses
    assert all(p.grad is None for p in step.model.parameters())  # zeroed with set_to_none


def test_accumulating_two_micro_batches_equals_one_double_batch() -> None:
    double = build(StepSpec(seq_len=16, micro_batch_size=4))
    (batch,) = double.synthetic_batches(torch.Generator().manual_seed(3))
    halves: list[Batch] = [{k: v[i : i + 2] for k, v in batch.items()} for i in (0, 2)]
    accumulated = build(StepSpec(seq_len=16, micro_batch_size=2, grad_accum_steps=2))
    loss_double = double.forward_backward([batch])
    loss_accumulated = accumulated.forward_backward(halves)
    torch.testing.assert_close(loss_accumulated, loss_double)
    for got, want in zip(grads(accumulated), grads(double), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    # ... and the optimizer step that follows lands on the same weights.
    accumulated.optimizer_step()
    double.optimizer_step()
    for got, want in zip(accumulated.model.parameters(), double.model.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "workload",
    [TINY_GPT, AdvisorWorkload("llama-tiny", {"n_layer": 2})],
    ids=lambda w: w.model,
)
def test_checkpointing_changes_memory_not_maths(workload: AdvisorWorkload) -> None:
    plain = build(StepSpec(seq_len=16, micro_batch_size=2), workload)
    checkpointed = build(
        StepSpec(seq_len=16, micro_batch_size=2, activation_checkpointing="full"), workload
    )
    assert len(grads(plain)) == 0
    batches = plain.synthetic_batches(torch.Generator().manual_seed(5))
    torch.testing.assert_close(
        checkpointed.forward_backward(batches), plain.forward_backward(batches)
    )
    got, want = grads(checkpointed), grads(plain)
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_fp16_overflow_is_skipped_and_counted() -> None:
    step = build(StepSpec(seq_len=16, micro_batch_size=2, precision="fp16"))
    batches = step.synthetic_batches()
    step.forward_backward(batches)
    scale_before = step.scaler.get_scale()
    before = [p.detach().clone() for p in step.model.parameters()]
    first = next(p for p in step.model.parameters() if p.grad is not None)
    assert first.grad is not None
    first.grad.view(-1)[0] = float("inf")  # as an fp16 overflow leaves it
    stats = step.optimizer_step()
    assert stats.skipped is not None and bool(stats.skipped)
    assert stats.loss_scale is not None and float(stats.loss_scale) < scale_before
    for got, want in zip(step.model.parameters(), before, strict=True):
        assert torch.equal(got, want)  # the step was skipped, not applied
    _, stats = step.step(batches)
    assert stats.skipped is not None and not bool(stats.skipped)


@pytest.mark.parametrize(
    "workload",
    [
        AdvisorWorkload("gpt-tiny", {"n_layer": 1}),
        AdvisorWorkload("bert-tiny", {"n_layer": 1}),
        AdvisorWorkload("llama-tiny", {"n_layer": 1}),
        AdvisorWorkload("hf:gpt2", {"n_layer": 1, "n_embd": 64, "n_head": 2}),
    ],
    ids=lambda w: w.model,
)
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_from_meta_step_runs_under_fake_tensors(
    workload: AdvisorWorkload, checkpointing: str
) -> None:
    if workload.model.startswith("hf:"):
        pytest.importorskip("transformers")
    spec = StepSpec(
        seq_len=16, micro_batch_size=2, grad_accum_steps=2, activation_checkpointing=checkpointing
    )
    with FakeTensorMode(allow_non_fake_inputs=True):
        step = workload.build_step(spec, "cpu", from_meta=True)
        assert all(isinstance(p, FakeTensor) for p in step.model.parameters())
        loss, stats = step.step(step.synthetic_batches())
    assert isinstance(loss, FakeTensor) and loss.shape == ()
    assert isinstance(stats.grad_norm, FakeTensor)
    facts = workload.facts()
    assert sum(p.numel() for p in step.model.parameters()) == facts.num_params  # ties kept


@pytest.mark.parametrize(("model", "objective"), [("gpt-tiny", "causal_lm"), ("bert-tiny", "mlm")])
def test_synthetic_batches_follow_the_objective(model: str, objective: str) -> None:
    step = build(
        StepSpec(seq_len=12, micro_batch_size=3, grad_accum_steps=2),
        AdvisorWorkload(model, {"n_layer": 1}),
    )
    assert step.adapter.objective == objective
    batches = step.synthetic_batches(torch.Generator().manual_seed(0))
    again = step.synthetic_batches(torch.Generator().manual_seed(0))
    assert len(batches) == 2
    for batch, same in zip(batches, again, strict=True):
        assert batch.keys() == {"input_ids", "labels"}
        assert batch["input_ids"].shape == batch["labels"].shape == (3, 12)
        assert all(torch.equal(batch[k], same[k]) for k in batch)
        if objective == "causal_lm":
            assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
        else:
            labelled = batch["labels"].ne(IGNORE_INDEX)
            assert labelled.any() and not labelled.all()
            assert step.adapter.mask_token_id is not None
            assert batch["input_ids"].eq(step.adapter.mask_token_id).any()
    assert not torch.equal(batches[0]["input_ids"], batches[1]["input_ids"])


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_priming_leaves_the_state_a_first_real_step_leaves(precision: str) -> None:
    # PrimableStep (the memory tracers' first iteration): same optimizer state keys and shapes
    # as after one real step, no gradient held, fp16's loss scale created
    spec = StepSpec(seq_len=8, micro_batch_size=2, precision=precision)
    primed, real = build(spec), build(spec)
    primed.prime_optimizer_state()
    real.step(real.synthetic_batches())
    trainable = [p for p in primed.model.parameters() if p.requires_grad]
    assert trainable and all(p.grad is None for p in primed.model.parameters())

    def shapes(step: AdvisorStep) -> list[dict[str, tuple[int, ...]]]:
        return [
            {k: tuple(v.shape) for k, v in step.optimizer.state[p].items()}
            for p in step.model.parameters()
            if p.requires_grad
        ]

    assert shapes(primed) == shapes(real)
    assert all(primed.optimizer.state[p]["exp_avg"].abs().sum() == 0 for p in trainable)
    if precision == "fp16":
        assert primed.scaler._scale is not None
        assert float(primed.scaler._scale) == float(real.scaler._scale)
    else:
        assert not primed.scaler.is_enabled()
