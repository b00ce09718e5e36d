"""One face for every model: logits and loss, the repeated blocks, the output head, shape facts,
weight tying.

Built-in presets, Hugging Face models and user factories all become a :class:`ModelAdapter`,
so the trainer, checkpointing, FSDP wrapping and the probes never branch on where a model came
from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from advisor.errors import ModelContractViolation
from advisor.models.objectives import Objective, lm_loss
from profilers.ssm_kernels import kernels_of
from profilers.workload import NO_OUTPUT_HEAD, ModelFacts


@dataclass
class ModelAdapter:
    module: nn.Module
    name: str
    family: str
    objective: str  # causal_lm | mlm
    # Dotted path of the ModuleList holding the repeated blocks; None: the model has none (one
    # layer, an nn.Sequential ...), so checkpointing per block has nothing to wrap and FSDP
    # wraps the root only.
    blocks_path: str | None
    vocab_size: int
    hidden_size: int
    num_heads: int
    max_seq_len: int  # 0: unknown (a user module that does not say)
    ffn_hidden_size: int | None = None
    num_kv_heads: int | None = None
    mask_token_id: int | None = None
    # The attention heads' width where the model sets one (a transformers config's head_dim);
    # None: hidden_size // num_heads.
    head_dim: int | None = None
    # Why the loss cannot be computed in chunks of tokens even though the model exposes an
    # output head (e.g. an hf model that scales or soft-caps its logits after the head); None:
    # no such reason is known.
    head_blocker: str | None = None

    # -- the repeated blocks ---------------------------------------------------------------
    def blocks(self) -> nn.ModuleList:
        """The repeated blocks; empty when the model has none."""
        if self.blocks_path is None:
            return nn.ModuleList()
        found = self.module.get_submodule(self.blocks_path)
        assert isinstance(found, nn.ModuleList)
        return found

    # -- forward and loss -------------------------------------------------------------------
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return extract_logits(self.module(input_ids), input_ids)

    def loss(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return lm_loss(self.logits(batch["input_ids"]), batch["labels"])

    # -- the output head (chunked loss) ---------------------------------------------------
    def output_head(self) -> nn.Linear | None:
        """The linear layer that turns the final hidden states into the logits, when the model
        exposes it as ``get_output_embeddings()`` (Hugging Face's name, which the built-in
        models share) and it is the last op of ``forward``; None otherwise."""
        if self.head_blocker is not None:
            return None
        get = getattr(self.module, "get_output_embeddings", None)
        head = get() if callable(get) else None
        return head if isinstance(head, nn.Linear) else None

    def loss_chunking_unavailable(self) -> str:
        """Why ``loss_chunks`` > 1 cannot run on this model; empty when it can."""
        if self.head_blocker is not None:
            return self.head_blocker
        return "" if self.output_head() is not None else NO_OUTPUT_HEAD

    def defer_output_head(self) -> nn.Linear:
        """Make the model's forward return its final hidden states (the head's input) instead
        of the logits, and return the head, for :func:`advisor.models.objectives.
        chunked_lm_loss` to apply chunk by chunk. The head stays where it is (parameters,
        state-dict keys, weight tying, FSDP/DDP wrapping unchanged): only its ``forward`` on
        this instance becomes the identity. Used by a training step built for ``loss_chunks``
        > 1, never undone."""
        head = self.output_head()
        if head is None:
            raise ValueError(f"{self.name}: {self.loss_chunking_unavailable()}")
        # An instance attribute shadows the class's forward in nn.Module.__call__.
        setattr(head, "forward", _identity)  # noqa: B010
        return head

    def make_objective(self, data_vocab_size: int) -> Objective:
        return Objective(self.objective, data_vocab_size, self.mask_token_id)

    # -- materialisation --------------------------------------------------------------------
    def retie(self) -> None:
        """Re-tie shared weights after ``to_empty`` (which breaks ties for non-dense tensors)."""
        tie = getattr(self.module, "tie_weights", None)
        if callable(tie):
            tie()

    def init_weights(self) -> None:
        """Initialise a model materialised from meta (``to_empty`` leaves memory uninitialised)."""
        init = getattr(self.module, "init_weights", None)
        if callable(init):
            init()
            return
        for sub in self.module.modules():
            reset = getattr(sub, "reset_parameters", None)
            if callable(reset):
                reset()

    # -- facts --------------------------------------------------------------------------------
    def facts(self) -> ModelFacts:
        params = list(self.module.parameters())  # a shared (tied) tensor is yielded once
        embedding = {
            id(m.weight): m.weight.numel()
            for m in self.module.modules()
            if isinstance(m, nn.Embedding)
        }
        blocks = self.blocks()
        sizes = {sum(p.numel() for p in block.parameters()) for block in blocks}
        return ModelFacts(
            name=self.name,
            family=self.family,
            objective=self.objective,
            num_params=sum(p.numel() for p in params),
            num_trainable_params=sum(p.numel() for p in params if p.requires_grad),
            num_embedding_params=sum(embedding.values()),
            num_layers=len(blocks),
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            vocab_size=self.vocab_size,
            max_seq_len=self.max_seq_len,
            block_class="+".join(dict.fromkeys(type(b).__name__ for b in blocks)),
            ffn_hidden_size=self.ffn_hidden_size,
            num_kv_heads=self.num_kv_heads,
            tied_embeddings=_has_tied_output(self.module),
            repeated_blocks=self.blocks_path is not None,
            output_head=not self.loss_chunking_unavailable(),
            output_head_reason=self.loss_chunking_unavailable(),
            uniform_blocks_from=(pattern := block_pattern(blocks))[0],
            block_period=pattern[1],
            largest_block_params=max(sizes) if len(sizes) > 1 else 0,
            state_space_kernels=kernels_of(self.module),
            head_dim=self._head_dim_if_unusual(),
        )

    def _head_dim_if_unusual(self) -> int:
        """:attr:`head_dim` where it differs from hidden_size // num_heads, else 0."""
        usual = self.hidden_size // self.num_heads if self.num_heads > 0 else 0
        return self.head_dim if self.head_dim and self.head_dim != usual else 0


def block_pattern(blocks: Iterable[nn.Module]) -> tuple[int, int]:
    """(prefix, period): from block ``prefix`` on, every block is built like the one
    ``period`` before it (:func:`_block_signature`), over at least three periods that fill the
    rest exactly. (0, 1) when all blocks are alike; DeepSeek-V3 and Kimi K2 put dense layers
    before their MoE layers (``first_k_dense_replace``: a prefix); Llama 4 Maverick alternates
    dense and MoE layers and leaves RoPE out of every 4th (period 4); Gemma 2 alternates
    sliding-window and global attention (period 2). With no such pattern, (last index, 1):
    never extended in depth."""

    signatures = [_block_signature(b) for b in blocks]
    count = len(signatures)
    for period in range(1, max(count // 3, 1) + 1):
        start = count - period  # the first block whose match runs to the end
        while start > 0 and signatures[start - 1] == signatures[start - 1 + period]:
            start -= 1
        # a whole number of periods, at least three, from the prefix to the last block
        start += (count - start) % period
        if count - start >= 3 * period:
            return start, period
    return max(count - 1, 0), 1


def _block_signature(block: nn.Module) -> tuple[Any, ...]:
    """How a block is built: its class, its parameters' names and shapes, and the flags and
    names its modules keep (public ``bool``/``str`` attributes: Llama 4's ``use_rope``, Gemma's
    ``attention_type``, ``is_sliding`` ...), which change what a block does without changing
    its parameters. Integers are left out: a layer's own index differs in every block."""
    flags = tuple(
        (path, key, value)
        for path, module in block.named_modules()
        for key, value in sorted(vars(module).items())
        if not key.startswith("_") and isinstance(value, bool | str)
    )
    return (
        type(block).__name__,
        tuple((name, tuple(p.shape)) for name, p in block.named_parameters()),
        flags,
    )


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _has_tied_output(module: nn.Module) -> bool:
    embeddings = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    return any(id(m.weight) in embeddings for m in module.modules() if isinstance(m, nn.Linear))


def extract_logits(out: Any, input_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Logits from a plain tensor, a ModelOutput/namespace with ``.logits``, or a dict.

    With ``input_ids``, the output must have one row per input token, (batch, seq, ...) for
    those ids: anything else (a loss, a shifted or pooled output) is the model breaking its
    contract, a one-line :class:`ModelContractViolation` naming the shape it returned, before
    the loss fails on it with an index error. The last dimension is not checked: a head padded past
    the vocabulary is fine, and a model that names no vocabulary has it read from its
    largest embedding, which may be a position table."""
    if isinstance(out, torch.Tensor):
        logits: Any = out
    else:
        logits = getattr(out, "logits", None)
        if logits is None and isinstance(out, Mapping):
            logits = out.get("logits")
        if logits is None and isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
            logits = out[0]
    if not isinstance(logits, torch.Tensor):
        raise ModelContractViolation(
            f"the model returned {type(out).__name__}, not logits: its forward(input_ids) must "
            "return a logits tensor (batch, seq, vocab) or an object with a .logits tensor"
        )
    if input_ids is not None and tuple(logits.shape[:-1]) != tuple(input_ids.shape):
        ids = tuple(input_ids.shape)
        raise ModelContractViolation(
            f"the model returned logits of shape {tuple(logits.shape)} for input_ids of shape "
            f"{ids}: its forward(input_ids) must return (batch, seq, vocab) = ({ids[0]}, "
            f"{ids[1]}, vocab), one row of logits per input token (not a loss, nor a shifted "
            "or pooled output)"
        )
    return logits


def find_repeated_blocks(module: nn.Module) -> str | None:
    """Dotted path of the ModuleList of blocks holding the most parameters.

    That is the stack of Transformer layers in every model we know (``blocks``,
    ``transformer.h``, ``bert.encoder.layer``, ``model.layers`` ...), also one that mixes
    classes of layers (Jamba's attention and Mamba layers, dense and MoE ones): each layer is
    still checkpointed and FSDP-wrapped on its own. Not a mixed list whose layers share
    parameters (Zamba2's hybrid layers all call one shared attention block, which no two FSDP
    units may hold), nor any list inside it. A module can name its own with an
    ``advisor_blocks`` attribute holding the dotted path (an empty string: none). None when
    there is no such list (a single layer, an ``nn.Sequential``, nested containers): the
    model still trains, without the knobs that need repeated blocks.
    """
    named = getattr(module, "advisor_blocks", None)
    if isinstance(named, str):
        if not named:
            return None
        found = module.get_submodule(named) if _has_submodule(module, named) else None
        if not isinstance(found, nn.ModuleList):
            raise ValueError(
                f"{type(module).__name__}.advisor_blocks names {named!r}, which is not an "
                "nn.ModuleList of the model: point it at the list of repeated layers, or set it "
                'to "" (no repeated blocks)'
            )
        return named
    lists: list[tuple[int, str]] = []
    shared: list[str] = []  # mixed lists whose layers share parameters
    for path, sub in module.named_modules():
        if not isinstance(sub, nn.ModuleList) or len(sub) == 0:
            continue
        if len({type(child) for child in sub}) > 1 and _layers_share_parameters(sub):
            shared.append(path)
            continue
        lists.append((sum(p.numel() for p in sub.parameters()), path))
    # Nor a list inside a layer of such a stack: Zamba2 was checkpointed and FSDP-wrapped at
    # an adapter list inside one layer until 2026-12-05.
    lists = [
        (size, path)
        for size, path in lists
        if not any(path.startswith(f"{inner}.") for inner in shared)
    ]
    return max(lists, key=lambda item: item[0])[1] if lists else None  # the first largest


def _layers_share_parameters(layers: nn.ModuleList) -> bool:
    """Whether two of ``layers`` hold the same parameter (a shared block called from several)."""
    seen: set[int] = set()
    for layer in layers:
        # remove_duplicate: a parameter tied within one layer counts once for it
        own = {id(p) for p in layer.parameters()}
        if own & seen:
            return True
        seen |= own
    return False


def _has_submodule(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True
