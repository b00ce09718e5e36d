"""Resolve a model spec (``--model``) and its overrides (``--model-arg``) into a ModelAdapter.

Specs: a built-in preset name (``gpt-tiny`` ...), ``hf:NAME_OR_PATH`` (a Hugging Face model built
from its configuration), or ``FILE.py:factory`` / ``package.module:factory`` (the user's own
``nn.Module``). Every failure the user can fix raises :class:`UsageProblem` naming the fix. Models
are built with their random init; initial weights are the trainer's (advisor.models.weights).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from advisor.errors import UsageProblem, one_line
from advisor.models.adapter import ModelAdapter, find_repeated_blocks
from advisor.models.presets import PRESETS

# Keys any spec accepts besides its own config fields.
ADAPTER_KEYS = ("objective",)


def parse_model_args(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["n_layer=2", "bias=false"]`` -> ``{"n_layer": 2, "bias": False}`` (JSON literals)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageProblem(f"--model-arg {pair!r} is not KEY=VALUE: write e.g. n_layer=2")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            lowered = raw.strip().lower()
            value = {"true": True, "false": False, "none": None}.get(lowered, raw)
        out[key] = value
    return out


# Random in-place initialisers: on ``meta`` they have no values to fill, and torch runs them
# through its Python references (torch._refs), whose first call imports torch._dynamo: ~4 s
# of every meta build in a fresh process (the launcher's host-memory check, a resume's
# checkpoint check, a workload's facts), which nothing else there needed.
_TENSOR_INITS = (
    "normal_",
    "uniform_",
    "random_",
    "exponential_",
    "cauchy_",
    "log_normal_",
    "geometric_",
    "bernoulli_",
)


class _SkipInitOnMeta(torch.overrides.TorchFunctionMode):
    """Inside a ``meta`` build: ``torch.nn.init``'s initialisers and the tensors' random
    in-place fills return their (meta) tensor as is, after the same call on a small CPU
    stand-in of its rank and dtype (at most 2 along each dimension), so that what a real build
    refuses is refused here too (a fan of a 1-D tensor, ``uniform_(1, -1)``, an in-place fill
    of a leaf that requires grad), with torch's own message and the random state untouched.
    ``dirac_`` (whose check needs the real sizes) is skipped unchecked. Every other call runs
    as usual."""

    def __init__(self) -> None:
        super().__init__()
        init = torch.nn.init
        self.skipped = {
            f for name in dir(init) if name.endswith("_") and callable(f := getattr(init, name))
        } | {getattr(torch.Tensor, name) for name in _TENSOR_INITS}

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in self.skipped:
            tensor = args[0] if args else kwargs.get("tensor", kwargs.get("self"))
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                if func is not torch.nn.init.dirac_:
                    self._check_on_cpu(func, tensor, args, kwargs)
                return tensor
        return func(*args, **kwargs)

    @staticmethod
    def _check_on_cpu(
        func: Any, tensor: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        proxy = torch.empty(
            [min(size, 2) for size in tensor.shape], dtype=tensor.dtype, device="cpu"
        )
        if tensor.requires_grad and tensor.is_leaf:
            proxy.requires_grad_(True)

        def swap(value: Any) -> Any:
            return proxy if value is tensor else value

        with torch.random.fork_rng(devices=[]):
            func(*map(swap, args), **{key: swap(value) for key, value in kwargs.items()})


@contextlib.contextmanager
def _build_device(meta: bool) -> Iterator[None]:
    if meta:
        with torch.device("meta"), _SkipInitOnMeta():
            yield
    else:
        yield


def build_model(
    spec: str, model_args: Mapping[str, Any] | None = None, *, meta: bool = False
) -> ModelAdapter:
    """Build the model named by ``spec`` on CPU (or on ``meta``: no memory, no init)."""
    args = dict(model_args or {})
    objective = args.pop("objective", None)
    if objective is not None and objective not in ("causal_lm", "mlm"):
        raise UsageProblem(f"--model-arg objective={objective} is unknown: use causal_lm or mlm")
    if spec in PRESETS:
        adapter = _build_preset(spec, args, meta)
    elif spec.startswith("hf:"):
        from advisor.models.hf import build_hf

        adapter = build_hf(spec, args, meta)
    elif ":" in spec:
        adapter = _build_user(spec, args, meta)
    else:
        raise UsageProblem(
            f"unknown model spec {spec!r}: use a preset ({', '.join(PRESETS)}), "
            "hf:NAME_OR_PATH, FILE.py:factory or package.module:factory"
        )
    if objective is not None:
        adapter.objective = objective
    if adapter.objective == "mlm" and adapter.mask_token_id is None:
        adapter.mask_token_id = adapter.vocab_size - 1
    return adapter


def _build_preset(name: str, args: dict[str, Any], meta: bool) -> ModelAdapter:
    import advisor.models.bert as bert
    import advisor.models.gpt as gpt
    import advisor.models.llama as llama

    preset = PRESETS[name]
    config_cls, model_cls = {
        "gpt": (gpt.GPTConfig, gpt.GPT),
        "bert": (bert.BertConfig, bert.BertForMLM),
        "llama": (llama.LlamaConfig, llama.Llama),
    }[preset.family]
    fields = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(args) - fields)
    if unknown:
        raise UsageProblem(
            f"--model-arg {', '.join(unknown)} is not a field of {name}: "
            f"choose from {', '.join(sorted(fields | set(ADAPTER_KEYS)))}"
        )
    cfg = config_cls(**{**preset.config, **args})
    try:
        with _build_device(meta):
            module = model_cls(cfg)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise UsageProblem(f"cannot build {name} with {args}: {one_line(exc)}") from None
    c: Any = cfg
    shared: dict[str, Any] = dict(
        module=module,
        name=name,
        family=preset.family,
        blocks_path="blocks",
        vocab_size=c.vocab_size,
        hidden_size=c.n_embd,
        num_heads=c.n_head,
    )
    if preset.family == "gpt":
        return ModelAdapter(
            **shared,
            objective="causal_lm",
            max_seq_len=c.block_size,
            ffn_hidden_size=4 * c.n_embd,
        )
    if preset.family == "bert":
        return ModelAdapter(
            **shared,
            objective="mlm",
            max_seq_len=c.max_position,
            ffn_hidden_size=c.ffn_hidden,
            mask_token_id=c.mask_token_id if c.mask_token_id is not None else c.vocab_size - 1,
        )
    return ModelAdapter(
        **shared,
        objective="causal_lm",
        max_seq_len=c.max_seq_len,
        ffn_hidden_size=c.ffn_hidden,
        num_kv_heads=c.n_kv_head,
    )


# -- user factories ---------------------------------------------------------------------------


def load_factory(spec: str) -> Any:
    """``path/to/file.py:name`` or ``package.module:name`` -> the callable it names."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise UsageProblem(f"model spec {spec!r} must be FILE.py:factory or package.module:factory")
    if target.endswith(".py"):
        path = Path(target).expanduser()
        if not path.is_file():
            raise UsageProblem(f"model file {target} does not exist: check the path in --model")
        resolved = path.resolve()
        # A stable module name per file, so pickling by reference works in child processes.
        name = "advisor_user_" + hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
        module = sys.modules.get(name)
        if module is None:
            # Its own directory first, as `python FILE.py` has it: a model file that imports
            # a module beside it (`from blocks import Block`) loads from anywhere.
            _on_path(str(resolved.parent), first=True)
            loader_spec = importlib.util.spec_from_file_location(name, resolved)
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            try:
                loader_spec.loader.exec_module(module)
            except Exception as exc:
                del sys.modules[name]
                raise UsageProblem(
                    f"importing {target} failed ({one_line(exc)}): fix the file"
                ) from None
    else:
        # The working directory last, as `python -m` has it first: the console script's path
        # lacks it, so `--model mymodel:MyLM` (the record a Python API call made from that
        # directory) failed where the API's own processes imported it.
        _on_path(os.getcwd(), first=False)
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise UsageProblem(
                f"cannot import module {target!r} ({one_line(exc)}): install it or put it on "
                "PYTHONPATH"
            ) from None
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise UsageProblem(
            f"{target} has no callable {attr!r}: name a function returning nn.Module"
        )
    return factory


def _on_path(directory: str, *, first: bool) -> None:
    """Put ``directory`` on ``sys.path`` (first or last) unless it is there already."""
    if directory in sys.path or (not first and "" in sys.path):
        return
    if first:
        sys.path.insert(0, directory)
    else:
        sys.path.append(directory)


def _first_attr(objs: list[Any], names: tuple[str, ...]) -> Any:
    for obj in objs:
        if obj is None:
            continue
        for name in names:
            value = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _check_forward_takes_input_ids(spec: str, module: nn.Module) -> None:
    """The contract is ``model(input_ids)``: a forward that needs more (an attention mask, a
    labels tensor) failed at every probe and step with a TypeError; say it once, here."""
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):  # a builtin or C forward: nothing to read
        return
    try:
        signature.bind(None)
    except TypeError as exc:
        raise UsageProblem(
            f"{spec}: its forward{signature} cannot be called with input_ids alone "
            f"({one_line(exc)}): the advisor calls model(input_ids); give the other "
            "parameters defaults"
        ) from None


def _build_user(spec: str, args: dict[str, Any], meta: bool) -> ModelAdapter:
    factory = load_factory(spec)
    try:
        inspect.signature(factory).bind(**args)
    except TypeError as exc:
        if not args:  # nothing was passed: the factory needs arguments (or is not a factory)
            raise UsageProblem(
                f"{spec} can't be called with no arguments ({one_line(exc)}): --model names a "
                "function or class that builds the model; pass its parameters with "
                "--model-arg KEY=VALUE"
            ) from None
        raise UsageProblem(
            f"--model-arg does not fit {spec} ({one_line(exc)}): check its parameters"
        ) from None
    try:
        with _build_device(meta):
            module = factory(**args)
    except Exception as exc:
        raise UsageProblem(f"{spec} raised {one_line(exc)}") from None
    if not isinstance(module, nn.Module):
        raise UsageProblem(
            f"{spec} returned {type(module).__name__}, not a torch.nn.Module: return the model"
        )
    _check_forward_takes_input_ids(spec, module)
    try:
        blocks_path = find_repeated_blocks(module)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None
    config = getattr(module, "config", None)
    sources = [module, config]
    embeddings = [m for m in module.modules() if isinstance(m, nn.Embedding)]
    token_embedding = max(embeddings, key=lambda m: m.num_embeddings, default=None)
    heads = _first_attr(sources, ("n_head", "num_heads", "num_attention_heads", "nhead"))
    if heads is None:
        heads = next(
            (m.num_heads for m in module.modules() if isinstance(m, nn.MultiheadAttention)), 0
        )
    vocab = _first_attr(sources, ("vocab_size", "n_vocab"))
    if vocab is None and token_embedding is not None:
        vocab = token_embedding.num_embeddings
    if vocab is None:
        raise UsageProblem(
            f"{spec}: cannot tell the vocabulary size: give the module a `vocab_size` attribute"
        )
    hidden = _first_attr(sources, ("hidden_size", "n_embd", "d_model", "dim", "embed_dim"))
    if hidden is None and token_embedding is not None:
        hidden = token_embedding.embedding_dim
    max_len = _first_attr(
        sources, ("max_seq_len", "block_size", "max_position_embeddings", "n_positions")
    )
    objective = getattr(module, "objective", "causal_lm")
    return ModelAdapter(
        module=module,
        name=spec,
        family="custom",
        objective=objective,
        blocks_path=blocks_path,
        vocab_size=int(vocab),
        hidden_size=int(hidden or 0),
        num_heads=int(heads),
        max_seq_len=int(max_len or 0),
        mask_token_id=_first_attr(sources, ("mask_token_id",)),
    )
