"""Training objectives: turning a token window into a batch, and the loss on the model's logits.

A window is ``seq_len + 1`` consecutive token ids. Causal LM predicts token i+1 from tokens
<= i; masked LM (BERT) corrupts 15% of the first ``seq_len`` tokens (80% [MASK], 10% random,
10% unchanged) and predicts the originals there. Labels are -100 where no loss is taken.
Examples are built in data-loader workers from a generator seeded by the sample's position, so
the same position always yields the same example (deterministic resume).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
MLM_PROBABILITY = 0.15


@dataclass(frozen=True)
class Objective:
    """Picklable description of how to make examples (it travels to loader workers)."""

    kind: str  # causal_lm | mlm
    data_vocab_size: int = 256
    mask_token_id: int | None = None

    def example(
        self, window: torch.Tensor, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """``window``: (..., seq_len + 1) token ids -> input_ids and labels of (..., seq_len)."""
        if self.kind == "causal_lm":
            return {"input_ids": window[..., :-1], "labels": window[..., 1:]}
        assert self.mask_token_id is not None, "mlm needs a mask token id"
        assert generator is not None, "mlm masking draws from a seeded generator"
        return mask_tokens(window[..., :-1], self.mask_token_id, self.data_vocab_size, generator)


def mask_tokens(
    tokens: torch.Tensor, mask_token_id: int, vocab_size: int, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """BERT masking (Devlin et al. 2018, §3.1): 15% chosen; of those 80/10/10."""
    chosen = torch.rand(tokens.shape, generator=generator) < MLM_PROBABILITY
    if not chosen.any():  # keep the loss defined on short windows: predict one token at least
        chosen.view(-1)[torch.randint(tokens.numel(), (1,), generator=generator)] = True
    labels = torch.where(chosen, tokens, torch.full_like(tokens, IGNORE_INDEX))
    draw = torch.rand(tokens.shape, generator=generator)
    inputs = tokens.clone()
    inputs[chosen & (draw < 0.8)] = mask_token_id
    randomize = chosen & (draw >= 0.8) & (draw < 0.9)
    inputs[randomize] = torch.randint(vocab_size, tokens.shape, generator=generator)[randomize]
    return {"input_ids": inputs, "labels": labels}


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the labelled positions, always in fp32.

    Under autocast the logits are bf16/fp16; the softmax is taken in fp32 as CUDA autocast would
    do for ``cross_entropy`` anyway (explicit here so CPU and CUDA agree).
    """
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX
    )
