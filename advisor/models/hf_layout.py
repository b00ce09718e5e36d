"""A Hugging Face checkpoint's layout converted to the model's, as ``from_pretrained`` does.

transformers 5 renames keys on load (GPT-NeoX's ``embed_out`` -> ``lm_head``, Mixtral's
``block_sparse_moe`` -> ``mlp``) and stacks per-expert MoE tensors into fused ones; the files
(and the Hub) keep the original layout. This applies transformers' own conversion mapping, so
every family it knows is covered (:mod:`advisor.models.weights` calls it).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from advisor.errors import UsageProblem, one_line


def convert_hf_layout(
    module: nn.Module,
    state: dict[str, torch.Tensor],
    expected: Mapping[str, Any],
    *,
    source: str,
) -> dict[str, torch.Tensor]:
    """``state`` converted from a Hugging Face checkpoint layout to ``module``'s, the way
    transformers' ``from_pretrained`` converts it (``convert_and_load_state_dict_in_model``):
    the model's conversion mapping (``get_model_conversion_mapping``: renamings such as
    Mixtral's ``block_sparse_moe`` -> ``mlp``, then at most one converter per key, such as the
    per-expert ``w1``/``w3`` stacked into ``experts.gate_up_proj``), applied with transformers'
    own functions. A key whose converted name the model lacks keeps the file's name (so a
    mismatch names the file's keys); ``state`` unchanged for other modules or transformers < 5.
    Works on meta tensors (the header check): the operations only stack and concatenate."""
    try:
        from transformers import PreTrainedModel
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (
            WeightConverter,
            WeightRenaming,
            dot_natural_key,
            rename_source_key,
        )
    except ImportError:
        return state
    if not isinstance(module, PreTrainedModel):
        return state
    try:
        transforms = get_model_conversion_mapping(module)
        renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
        by_pattern = {p: c for c in converters for p in c.source_patterns}
        out: dict[str, torch.Tensor] = {}
        pending: dict[str, Any] = {}  # target key -> its converter, collecting its sources
        # Natural order (experts 2 before 10): a converter stacks its sources in arrival order.
        for key in sorted(state, key=dot_natural_key):
            new, pattern = rename_source_key(
                key, renamings, converters, module.base_model_prefix, dict(expected)
            )
            if new not in expected:
                out[key] = state[key]
            elif pattern is None:
                out[new] = state[key]
            else:
                converter = pending.setdefault(new, copy.deepcopy(by_pattern[pattern]))
                converter.add_tensor(new, key, pattern, state[key])
        for target, converter in pending.items():
            converted = converter.convert(target, model=module, config=module.config)
            out.update({k: v[0] if isinstance(v, list) else v for k, v in converted.items()})
    except Exception as exc:  # a layout transformers itself could not convert
        raise UsageProblem(
            f"cannot convert {source} to {type(module).__name__}'s layout with transformers' "
            f"checkpoint conversion ({one_line(exc)}): pass weights saved from this model"
        ) from None
    return out
