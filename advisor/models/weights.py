"""Initial weights from files: read a state dict, match it to the model, load it.

Formats: safetensors (one file, or a sharded ``*.safetensors.index.json``), PyTorch files
(``pytorch_model.bin``, a plain state-dict ``.pt``, its sharded index, or our own trainer's
``state.pt`` whose ``model`` entry is the state dict; always ``torch.load(weights_only=True)``)
and ``torch.distributed.checkpoint`` directories (our FSDP checkpoints). Everything is read
from local files: nothing here can reach the network.

Loading is strict with the few exceptions every real checkpoint needs: a tied weight saved under
one of its names (GPT-2 saves ``transformer.wte.weight``, not ``lm_head.weight``), the key
prefix of a Hugging Face base model (``h.0...`` for ``transformer.h.0...``), a ``module.`` or
``_orig_mod.`` prefix left by DDP or ``torch.compile``, the keys a Hugging Face class says
to ignore, and saved copies of non-persistent buffers (``rotary_emb.inv_freq`` in older Llama
files: the model computes them). A Hugging Face model's checkpoint layout is converted as
``from_pretrained`` converts it (transformers 5 renames keys, e.g. GPT-NeoX's ``embed_out``, and
stacks per-expert MoE tensors into fused ones): with transformers' own conversion mapping, so
every family it knows is covered. Anything else that does not match, and two different tensors
for one tied weight, is a one-line :class:`UsageProblem` naming a few of the keys and the fix.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from advisor.errors import UsageProblem, one_line
from advisor.models.hf_layout import convert_hf_layout

# Hugging Face weight files in a model directory, in the order from_pretrained prefers them.
HF_WEIGHT_FILES: tuple[str, ...] = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# Prefixes wrappers leave on saved keys: DDP's ``module.``, torch.compile's ``_orig_mod.``.
WRAPPER_PREFIXES: tuple[str, ...] = ("module.", "_orig_mod.")
NUM_KEYS_SHOWN = 3
FIX = "pass weights saved from this model (the same --model and --model-arg)"
# An hf:DIR's own weights are of the model DIR/config.json describes, not one --model-arg changed.
HF_DIR_FIX = (
    "{directory}'s weights are of the model its config.json describes: drop the --model-arg "
    "that change its shape, or build from the config alone (random init) with "
    "--model hf:{directory}/config.json"
)
# No --model-arg was given: DIR's config.json itself does not describe the weights beside it.
HF_DIR_MISMATCH_FIX = (
    "{directory}/config.json and the weights in {directory} disagree: put the config.json the "
    "weights were saved with beside them, or build from the config alone (random init) with "
    "--model hf:{directory}/config.json"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class WeightsSource:
    """Where initial weights come from. ``path``: what the user is shown (a file, an index or
    a checkpoint directory); ``kind``: safetensors | torch | dcp; ``files``: what is read."""

    path: Path
    kind: str
    files: tuple[Path, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadedWeights:
    """What was loaded: shown by ``advisor train`` and kept in ``train_config.json``."""

    source: str
    num_params: int  # parameter elements set from the file (a tied tensor counted once)
    num_tensors: int  # entries of the file's state dict that were used

    def describe(self) -> str:
        return f"weights: {self.source} ({self.num_params:,} params)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "num_params": self.num_params,
            "num_tensors": self.num_tensors,
        }


# -- locating -----------------------------------------------------------------------------------


def hf_weights(directory: Path) -> WeightsSource | None:
    """The weights of a Hugging Face model directory, or None when it holds only a config."""
    for name in HF_WEIGHT_FILES:
        path = directory / name
        if path.is_file():
            return weights_file(path)
    return None


def weights_file(path: Path) -> WeightsSource:
    """A single weights file: ``.safetensors``, a sharded ``*.index.json``, else PyTorch."""
    if path.name.endswith(".index.json"):
        shards = _index_shards(path)
        kind = "safetensors" if all(s.suffix == ".safetensors" for s in shards) else "torch"
        return WeightsSource(path=path, kind=kind, files=shards)
    kind = "safetensors" if path.suffix == ".safetensors" else "torch"
    return WeightsSource(path=path, kind=kind, files=(path,))


def _index_shards(index: Path) -> tuple[Path, ...]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageProblem(
            f"{index} is not a sharded-weights index ({one_line(exc)}): it must be JSON with a "
            '"weight_map" of tensor name -> shard file'
        ) from None
    shards = tuple(index.parent / name for name in names)
    missing = [s.name for s in shards if not s.is_file()]
    if missing:
        raise UsageProblem(
            f"{index} names shard(s) {', '.join(missing[:NUM_KEYS_SHOWN])} that are not in "
            f"{index.parent}: copy every shard of the checkpoint next to its index"
        )
    return shards


# -- reading ------------------------------------------------------------------------------------


def read_state_dict(source: WeightsSource) -> dict[str, torch.Tensor]:
    """The tensors of ``source`` on the CPU, by name."""
    if source.kind == "dcp":
        return _read_dcp(source.path)
    state: dict[str, torch.Tensor] = {}
    for file in source.files:
        part = _read_safetensors(file) if source.kind == "safetensors" else _read_torch(file)
        state.update(part)
    return state


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise UsageProblem(
            f"{path} is a safetensors file and reading it needs the 'safetensors' package: "
            "pip install safetensors"
        ) from None
    try:
        return dict(load_file(str(path), device="cpu"))
    except Exception as exc:
        raise UsageProblem(
            f"cannot read {path} as safetensors ({one_line(exc)}): is the file complete?"
        ) from None


def _read_torch(path: Path, *, mmap: bool = False) -> dict[str, torch.Tensor]:
    """The state dict in a PyTorch file; ``mmap``: its storages mapped, not read (zip files)."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:
        raise UsageProblem(
            f"cannot read {path} as a PyTorch weights file ({one_line(exc)}): pass a state dict "
            "saved with torch.save(model.state_dict(), ...), a .safetensors file or a checkpoint"
        ) from None
    state = _find_state_dict(data)
    if state is None:
        raise UsageProblem(
            f"{path} holds no state dict of tensors: save it with "
            "torch.save(model.state_dict(), PATH)"
        )
    return state


def _find_state_dict(data: Any) -> dict[str, torch.Tensor] | None:
    """A mapping of tensors, or the one under ``model`` / ``state_dict`` / ``model_state_dict``
    (our checkpoints' ``state.pt`` and the usual training-script layouts)."""
    if not isinstance(data, Mapping) or not data:
        return None
    if all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in data.items()):
        return dict(data)
    for key in ("model", "state_dict", "model_state_dict"):
        found = _find_state_dict(data.get(key))
        if found is not None:
            return found
    return None


def _dcp_model_entries(directory: Path) -> dict[str, Any]:
    """The ``model`` tensors a ``torch.distributed.checkpoint`` directory's metadata lists, by
    name under the model (``TensorStorageMetadata``: size and dtype)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        metadata = dcp.FileSystemReader(str(directory)).read_metadata()
    except Exception as exc:
        raise UsageProblem(
            f"cannot read the distributed checkpoint {directory} ({one_line(exc)}): pass a "
            "complete checkpoint directory"
        ) from None
    return {
        key.removeprefix("model."): meta
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }


def _read_dcp(directory: Path) -> dict[str, torch.Tensor]:
    """The ``model`` entries of a ``torch.distributed.checkpoint`` directory (an FSDP
    checkpoint of ours), gathered into whole tensors in this one process."""
    import torch.distributed.checkpoint as dcp

    model = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in _dcp_model_entries(directory).items()
    }
    if not model:
        raise UsageProblem(
            f"{directory} holds no model tensors: pass a checkpoint that 'advisor train' wrote"
        )
    with warnings.catch_warnings():
        # Said even when asked for (no_dist=True): one process reading it whole is the intent.
        # Worded "is disabled" or "is unavailable or uninitialized" (by release and path).
        warnings.filterwarnings("ignore", message=r"torch\.distributed is (disabled|unavailable)")
        dcp.load({"model": model}, checkpoint_id=str(directory), no_dist=True)
    return model


def read_shapes(source: WeightsSource) -> dict[str, torch.Tensor] | None:
    """The tensors of ``source`` as ``meta`` tensors (names and shapes, no values), read from
    the files' headers and metadata only: a safetensors header, a PyTorch zip file memory-mapped
    (its storages never read), a distributed checkpoint's metadata. None where that is not
    possible without reading everything (a PyTorch file of the legacy, non-zip format)."""
    state: dict[str, torch.Tensor] = {}
    if source.kind == "dcp":
        return _dcp_shapes(source.path)
    for file in source.files:
        part = _safetensors_shapes(file) if source.kind == "safetensors" else _torch_shapes(file)
        if part is None:
            return None
        state.update(part)
    return state


def _meta(shape: Any) -> torch.Tensor:
    return torch.empty(tuple(shape), device="meta")


def _safetensors_shapes(path: Path) -> dict[str, torch.Tensor]:
    try:
        from safetensors import safe_open
    except ImportError:
        return {k: _meta(v.shape) for k, v in _read_safetensors(path).items()}  # says to install
    try:
        with safe_open(str(path), framework="pt") as opened:
            return {k: _meta(opened.get_slice(k).get_shape()) for k in opened.keys()}  # noqa: SIM118
    except Exception as exc:
        raise UsageProblem(
            f"cannot read {path} as safetensors ({one_line(exc)}): is the file complete?"
        ) from None


def _torch_shapes(path: Path) -> dict[str, torch.Tensor] | None:
    import zipfile

    if not zipfile.is_zipfile(path):
        return None  # the legacy format cannot be memory-mapped: checked when it is loaded
    state = _read_torch(path, mmap=True)
    return {k: _meta(v.shape) for k, v in state.items()}


def _dcp_shapes(directory: Path) -> dict[str, torch.Tensor]:
    return {key: _meta(meta.size) for key, meta in _dcp_model_entries(directory).items()}


# -- matching and loading ---------------------------------------------------------------------


def load_weights(
    module: nn.Module, source: WeightsSource, name: str, *, fix: str = FIX
) -> LoadedWeights:
    """Read ``source`` and load it into ``module`` (model ``name`` in messages), in place;
    ``fix`` is what a mismatch's message tells the user to do.

    Call after the module is on its device and in its dtype and before any wrapper (checkpoint
    wrapper, DDP, FSDP): the values are copied into the existing parameters.
    """
    state = read_state_dict(source)
    return load_state(module, state, source=str(source.path), name=name, fix=fix)


def load_state(
    module: nn.Module,
    state: Mapping[str, torch.Tensor],
    *,
    source: str,
    name: str,
    fix: str = FIX,
) -> LoadedWeights:
    """Match ``state``'s keys and shapes to ``module`` and copy them in; UsageProblem if they
    do not fit (a few missing/unexpected keys, or the first shapes that differ, and the fix)."""
    expected = module.state_dict(keep_vars=True)
    usable = _matched(module, expected, state, source=source, name=name, fix=fix)
    module.load_state_dict(usable, strict=False)
    loaded = {id(expected[k]) for k in usable}
    num_params = sum(p.numel() for p in module.parameters() if id(p) in loaded)
    return LoadedWeights(source=source, num_params=num_params, num_tensors=len(usable))


def check_shapes(module: nn.Module, source: WeightsSource, name: str, *, fix: str = FIX) -> None:
    """Raise the UsageProblem :func:`load_weights` would, from the files' headers only
    (:func:`read_shapes`), so a run can refuse weights of another model before it profiles.
    ``module`` may be built on the meta device. Nothing is checked where the headers cannot be
    read cheaply (the load checks it)."""
    state = read_shapes(source)
    if state is None:
        return
    expected = module.state_dict(keep_vars=True)
    _matched(module, expected, state, source=str(source.path), name=name, fix=fix)


def _matched(
    module: nn.Module,
    expected: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    *,
    source: str,
    name: str,
    fix: str,
) -> dict[str, torch.Tensor]:
    """The entries of ``state`` that set ``module``'s tensors, under its names; UsageProblem
    when keys are missing or unexpected, shapes differ, or a tied tensor gets two values."""
    renamed = _rename(state, expected, module, source=source)
    missing = _missing(module, expected, renamed)
    computed = _computed_buffers(module, expected)
    unexpected = [
        k
        for k in renamed
        if k not in expected
        and not _ignored(module, k, "unexpected")
        and not ({k, _tail(k)} & computed)
    ]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} model tensor(s) missing from it ({_few(missing)})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected ({_few(unexpected)})")
        raise UsageProblem(f"{source} does not match {name}: {' and '.join(parts)}: {fix}")
    differ = [  # in the model's order: its first tensors are the ones a user recognises
        f"{k} {tuple(renamed[k].shape)} in the file, {tuple(v.shape)} in the model"
        for k, v in expected.items()
        if k in renamed and tuple(renamed[k].shape) != tuple(v.shape)
    ]
    if differ:
        raise UsageProblem(
            f"{source} does not fit {name}: {len(differ)} tensor(s) differ in shape, e.g. "
            f"{'; '.join(differ[:NUM_KEYS_SHOWN])}: {fix}"
        )
    usable = {k: v for k, v in renamed.items() if k in expected}
    _check_tied(module, expected, usable, source=source, name=name)
    return usable


def _check_tied(
    module: nn.Module,
    expected: Mapping[str, Any],
    usable: Mapping[str, torch.Tensor],
    *,
    source: str,
    name: str,
) -> None:
    """Refuse two different file tensors for one tied tensor of ``module``: loading both would
    keep whichever comes last (untied weights into a tied model lose the input embedding).
    Equal values are a tied model saved under both names. Headers (meta tensors) have no
    values: the load checks them."""
    first: dict[int, str] = {}
    for key in (k for k in expected if k in usable):  # the model's order: embedding, then head
        other, value = first.setdefault(id(expected[key]), key), usable[key]
        if other == key or value.is_meta or usable[other].is_meta:
            continue
        if not torch.equal(usable[other], value.to(usable[other].dtype)):
            raise UsageProblem(
                f"{source} holds two different tensors, {other} and {key}, for one tensor that "
                f"{name} ties (shares): build the model untied ({_untie_hint(module)}) to load "
                "both, or pass weights saved from a tied model"
            )


def _untie_hint(module: nn.Module) -> str:
    """The --model-arg that builds ``module``'s model without tied weights."""
    config = getattr(module, "config", None)
    if hasattr(config, "tie_word_embeddings"):  # a Hugging Face config
        return "--model-arg tie_word_embeddings=false"
    if hasattr(config, "tie_weights"):  # ours: gpt, llama
        return "--model-arg tie_weights=false"
    return "a factory argument that does not share the embedding and the output head"


def _rename(
    state: Mapping[str, torch.Tensor],
    expected: Mapping[str, Any],
    module: nn.Module,
    *,
    source: str,
) -> dict[str, torch.Tensor]:
    """``state``'s keys as ``module`` names them: wrapper prefixes off; a Hugging Face
    checkpoint layout converted (:func:`advisor.models.hf_layout.convert_hf_layout`); a
    Hugging Face base model's keys under its ``base_model_prefix`` (or off it), when that is
    what matches."""
    keys = list(state)
    for prefix in WRAPPER_PREFIXES:
        if keys and all(k.startswith(prefix) for k in keys):
            keys = [k.removeprefix(prefix) for k in keys]
    out = dict(zip(keys, state.values(), strict=True))
    if not all(k in expected for k in out):
        out = convert_hf_layout(module, out, expected, source=source)
    base = getattr(module, "base_model_prefix", "")
    if isinstance(base, str) and base:
        head = base + "."
        if not any(k in expected for k in out):
            if any(head + k in expected for k in out):  # a base model's weights in a head model
                out = {(head + k if head + k in expected else k): v for k, v in out.items()}
            elif any(k.removeprefix(head) in expected for k in out):  # the reverse
                out = {k.removeprefix(head): v for k, v in out.items()}
    return out


def _missing(
    module: nn.Module, expected: Mapping[str, Any], state: Mapping[str, torch.Tensor]
) -> list[str]:
    """Model keys the file does not set; a tied tensor is set through any of its names."""
    present = {id(expected[k]) for k in state if k in expected}
    return [
        k
        for k, v in expected.items()
        if k not in state and id(v) not in present and not _ignored(module, k, "missing")
    ]


def _ignored(module: nn.Module, key: str, which: str) -> bool:
    """A key the model's class says to ignore when loading (Hugging Face's
    ``_keys_to_ignore_on_load_missing`` / ``_keys_to_ignore_on_load_unexpected``: regexes)."""
    patterns = getattr(module, f"_keys_to_ignore_on_load_{which}", None) or ()
    return any(re.search(p, key) for p in patterns)


def _computed_buffers(module: nn.Module, expected: Mapping[str, Any]) -> set[str]:
    """The names a file may hold a copy of a non-persistent buffer under, left unloaded: such
    a buffer is not in the state dict because the model computes it. Older files keep it one
    module deeper than the model does now (``model.layers.0.self_attn.rotary_emb.inv_freq``
    for ``model.rotary_emb.inv_freq``), so its last two name parts count too, as they do in
    transformers' own exception for it (``_adjust_missing_and_unexpected_keys``)."""
    names = {k for k, _ in module.named_buffers() if k not in expected}
    return names | {_tail(k) for k in names}


def _tail(key: str) -> str:
    return ".".join(key.split(".")[-2:])


def _few(keys: list[str]) -> str:
    shown = ", ".join(keys[:NUM_KEYS_SHOWN])
    return shown + (", ..." if len(keys) > NUM_KEYS_SHOWN else "")
