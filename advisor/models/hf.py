"""``hf:NAME_OR_PATH``: a Hugging Face ``transformers`` model built from its configuration.

No network: NAME_OR_PATH is a local directory holding ``config.json``, a JSON config file, or a
model type whose config class has defaults (``hf:gpt2``, ``hf:bert``, ``hf:llama`` ...).
Encoders (BERT, RoBERTa ...) train with the masked-LM objective, decoders with causal LM. The
model is built here with its own random init (probes need no more); the trainer then loads a
directory's weights, when it has any (advisor.trainer.checkpoint.initial_weights).
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import torch

from advisor.errors import UsageProblem, one_line
from advisor.models.adapter import ModelAdapter, find_repeated_blocks

INSTALL_HINT = "pip install 'transformer-advisor[hf]'"


def import_transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub from here
    try:
        import transformers
    except ImportError:
        raise UsageProblem(
            f"hf: models need the optional 'transformers' package: {INSTALL_HINT}"
        ) from None
    transformers.logging.set_verbosity_error()
    return transformers


def load_hf_config(name_or_path: str, args: dict[str, Any] | None = None) -> Any:
    """The transformers config of ``name_or_path`` with ``args`` (``--model-arg``) applied.

    The overrides go through the config's constructor with the file's fields, not onto a built
    config: many configs derive fields when constructed (Llama's and Mistral's ``head_dim`` =
    hidden / heads when the file gives none, DeepSeek-V3's ``head_dim`` and ``qk_head_dim``
    from its rope and nope dims), and a field set afterwards left them stale: ``hf:mistral
    --model-arg hidden_size=64 --model-arg num_attention_heads=4`` built heads of 128
    dimensions (4096 / 32, the defaults), and a DeepSeek-V3 with smaller rope dims failed in
    its first forward."""
    tf = import_transformers()
    model_type, data = _config_source(tf, name_or_path)
    args = dict(args or {})
    try:
        base = tf.AutoConfig.for_model(model_type, **data)
    except Exception as exc:  # transformers 5 validates configs: huggingface_hub's own errors
        raise UsageProblem(
            f"hf:{name_or_path}: its config does not validate ({one_line(exc)}): fix its fields"
        ) from None
    unknown = sorted(k for k in args if not hasattr(base, k))
    if unknown:
        read = _fields_read_by_model(type(base))
        unknown = [k for k in unknown if k not in read]
    if unknown:
        raise UsageProblem(
            f"--model-arg {', '.join(unknown)} is not a field of {type(base).__name__}: "
            "check the config's attribute names"
        )
    if not args:
        return base
    try:
        return tf.AutoConfig.for_model(model_type, **{**data, **args})
    except Exception as exc:  # TypeError, ValueError, huggingface_hub's StrictDataclassError
        raise UsageProblem(
            f"hf:{name_or_path}: {type(base).__name__} refuses these --model-arg values "
            f"({one_line(exc)}): check them against the config class"
        ) from None


_CONFIG_READ = re.compile(r"getattr\(\s*(?:self\.)?config\s*,\s*[\"'](\w+)[\"']|\bconfig\.(\w+)\b")


def _fields_read_by_model(config_class: type) -> set[str]:
    """Config attributes the family's modeling code reads, with or without a default.

    Some config classes keep an attribute only when given: Qwen3-MoE's modeling code takes
    ``getattr(config, "head_dim", hidden // heads)`` while ``Qwen3MoeConfig()`` has no
    ``head_dim`` (the real Qwen3-30B-A3B's config.json sets 128). Such a field is a real
    knob, not a typo, so ``--model-arg`` takes it; a name nothing reads is still refused.
    Empty when the modeling module cannot be found or read."""
    module = config_class.__module__
    if ".configuration_" not in module:
        return set()
    try:
        source = inspect.getsource(
            importlib.import_module(module.replace(".configuration_", ".modeling_"))
        )
    except Exception:  # no modeling module, no source (a frozen install): the strict check stands
        return set()
    return {a or b for a, b in _CONFIG_READ.findall(source)}


# How transformers (5.x) writes a non-finite float into config.json, and reads it back
# (Mamba-2 families' time_step_limit (0.0, inf)): {"__float__": "Infinity"}.
_FLOAT_TAGS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _float_tag(obj: dict[str, Any]) -> Any:
    """json object hook: a tagged non-finite float as the float, anything else as it is."""
    if len(obj) == 1 and obj.get("__float__") in _FLOAT_TAGS:
        return _FLOAT_TAGS[obj["__float__"]]
    return obj


def _read_config(path: Path) -> Any:
    return json.loads(path.read_text(), object_hook=_float_tag)


def _config_source(tf: Any, name_or_path: str) -> tuple[str, dict[str, Any]]:
    """(model type, the fields a config file gives: none for a bare model type)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageProblem(f"{path} has no config.json: point hf: at a model's config dir")
        path = path / "config.json"
    if path.is_file():
        # a damaged config.json in hf:DIR ended in a JSONDecodeError traceback (exit 1)
        try:
            data = _read_config(path)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UsageProblem(
                f"{path} is not valid JSON ({one_line(exc)}): pass a config.json"
            ) from None
    else:
        types = sorted(tf.CONFIG_MAPPING.keys())
        if name_or_path not in tf.CONFIG_MAPPING:
            raise UsageProblem(
                f"hf:{name_or_path} is neither a local config path nor a transformers model type "
                "(nothing is downloaded): save the model's config.json locally and pass "
                f"hf:DIR, or use a model type such as gpt2, bert, llama ({len(types)} known)"
            )
        return name_or_path, {}
    model_type = data.pop("model_type", None) if isinstance(data, dict) else None
    if not isinstance(model_type, str) or model_type not in tf.CONFIG_MAPPING:
        what = (
            "has no model_type" if model_type is None else f"has unknown model_type {model_type!r}"
        )
        known = len(tf.CONFIG_MAPPING.keys())  # the lazy mapping's len() is 0
        raise UsageProblem(
            f"{path}: config {what}: set it to a transformers model type (e.g. gpt2, llama), "
            f"or upgrade transformers ({tf.__version__} knows {known} model types)"
        )
    return model_type, data


def build_hf(spec: str, args: dict[str, Any], meta: bool) -> ModelAdapter:
    tf = import_transformers()
    from transformers.models.auto import modeling_auto

    config = load_hf_config(spec[3:], args)
    config.use_cache = False  # training: no KV cache
    model_type = config.model_type
    if getattr(config, "is_encoder_decoder", False):
        # BART has a masked-LM mapping (its seq2seq model) and trained as an "encoder" with
        # its decoder fed the masked input, silently; T5 was refused for want of a head.
        raise UsageProblem(
            f"hf model type {model_type!r} is an encoder-decoder (seq2seq) model: the advisor "
            "trains decoder-only (causal LM) and encoder-only (masked LM) models; use one of "
            "those"
        )
    causal = model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    masked = model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    if masked and (not causal or not getattr(config, "is_decoder", False)):
        objective, auto = "mlm", tf.AutoModelForMaskedLM
    elif causal:
        objective, auto = "causal_lm", tf.AutoModelForCausalLM
    else:
        raise UsageProblem(
            f"hf model type {model_type!r} has no causal-LM or masked-LM head in transformers: "
            "use a decoder or encoder language model"
        )
    try:
        with torch.device("meta") if meta else torch.device("cpu"):
            try:
                module = auto.from_config(config, attn_implementation="sdpa")
            except (ValueError, ImportError):
                # This architecture has no SDPA path (Gemma 2, gpt-oss: soft-capping, sinks).
                # Left unnamed, transformers 5 picks SDPA again and refuses again.
                module = auto.from_config(config, attn_implementation="eager")
    except Exception as exc:
        raise UsageProblem(f"cannot build {spec} ({one_line(exc)}){_build_hint(config)}") from None
    module = module.float() if not meta else module.to(torch.float32)

    def first(*names: str) -> int | None:
        for name in names:
            value = getattr(config, name, None)
            if isinstance(value, int):
                return value
        return None

    hidden = first("hidden_size", "n_embd", "d_model") or 0
    heads = first("num_attention_heads", "n_head") or 0
    return ModelAdapter(
        module=module,
        name=spec,
        family=f"hf-{model_type}",
        objective=objective,
        blocks_path=find_repeated_blocks(module),
        vocab_size=int(config.vocab_size),
        hidden_size=hidden,
        num_heads=heads,
        max_seq_len=first("max_position_embeddings", "n_positions", "max_seq_len") or 0,
        ffn_hidden_size=first("intermediate_size", "n_inner"),
        num_kv_heads=first("num_key_value_heads"),
        mask_token_id=first("mask_token_id"),
        head_blocker=_logits_after_head(config),
        head_dim=_attention_head_dim(config),
    )


def _attention_head_dim(config: Any) -> int | None:
    """The attention heads' width a config sets: ``head_dim`` (Qwen3, Gemma, Llama), or for
    multi-head latent attention (DeepSeek-V2/V3, whose ``head_dim`` is the rotary part only) the
    mean of the query/key and value widths: its scores cost 2·T²·qk and its output 2·T²·v per
    head, as a head of that mean width costs. None when the config sets neither."""
    qk, v = getattr(config, "qk_head_dim", None), getattr(config, "v_head_dim", None)
    if isinstance(qk, int) and isinstance(v, int) and qk > 0 and v > 0:
        return (qk + v) // 2
    width = getattr(config, "head_dim", None)
    return width if isinstance(width, int) and width > 0 else None


def _build_hint(config: Any) -> str:
    """The fix for a build failure the config explains: a padding token id past a vocabulary
    shrunk by --model-arg (Phi-3's 32000, ModernBERT's 50283) fails in nn.Embedding."""
    pad, vocab = getattr(config, "pad_token_id", None), getattr(config, "vocab_size", None)
    if isinstance(pad, int) and isinstance(vocab, int) and pad >= vocab:
        return (
            f": its pad_token_id {pad} is not below vocab_size {vocab}; pass --model-arg "
            "pad_token_id=0 (or a larger vocab_size)"
        )
    return ""


# Config fields of transformers models that change the logits after the output head (Gemma 2's
# soft-capping, Cohere's and Granite's scaling): their head's output is not the logits, so a
# loss over chunks of the head would differ from the model's.
LOGITS_AFTER_HEAD = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _logits_after_head(config: Any) -> str | None:
    changed = [
        name for name in LOGITS_AFTER_HEAD if getattr(config, name, None) not in (None, 1, 1.0)
    ]
    if not changed:
        return None
    return (
        f"{config.model_type} changes its logits after the output head ({', '.join(changed)}), "
        "so the head's output is not the logits"
    )
