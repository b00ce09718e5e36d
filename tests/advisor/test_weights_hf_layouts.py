"""Initial weights in the layouts real checkpoints have: Hugging Face checkpoint layouts that
``from_pretrained`` converts (MoE experts, GPT-NeoX's ``embed_out``), saved copies of
non-persistent buffers, untied weights for a tied model, and the fix a mismatch names.

Each model is tiny and built here from a config, saved with ``save_pretrained`` or
``torch.save``: no download. A load is proven by comparing every tensor with
``from_pretrained`` of the same directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from advisor.cli import main
from advisor.errors import UsageProblem
from advisor.models import build_model
from advisor.models.weights import check_shapes, load_weights, weights_file
from advisor.trainer.checkpoint import check_initial_weights, initial_weights, weights_fix

transformers = pytest.importorskip("transformers")

TINY = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4}
TINY_MOE = {**TINY, "intermediate_size": 48, "num_key_value_heads": 2}
TRAIN = ["--data", "synthetic", "--seq-len", "16", "--global-batch-size", "2", "--steps", "1"]
TRAIN += ["--micro-batch-size", "2", "--eval-every", "0", "--quiet"]


def _perturbed(model: nn.Module, seed: int = 3) -> nn.Module:
    """Weights no init reproduces."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    return model


def _mixtral() -> Any:
    config = transformers.MixtralConfig(**TINY_MOE, num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config)


def _qwen2_moe() -> Any:
    config = transformers.Qwen2MoeConfig(
        **TINY_MOE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
        shared_expert_intermediate_size=48,
    )  # fmt: skip
    return transformers.Qwen2MoeForCausalLM(config)


def _gpt_neox() -> Any:
    config = transformers.GPTNeoXConfig(**TINY, intermediate_size=64)
    return transformers.GPTNeoXForCausalLM(config)


def _llama(**overrides: Any) -> Any:
    config = transformers.LlamaConfig(**TINY_MOE, **overrides)
    return transformers.LlamaForCausalLM(config)


def _saved(model: nn.Module, directory: Path) -> Path:
    _perturbed(model).save_pretrained(directory)
    return directory


def _assert_loads_as_from_pretrained(directory: Path) -> None:
    source = initial_weights(f"hf:{directory}", None)
    assert source is not None
    check_shapes(build_model(f"hf:{directory}", meta=True).module, source, "m")  # headers only
    adapter = build_model(f"hf:{directory}")
    load_weights(adapter.module, source, "m")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(directory).state_dict()
    ours = adapter.module.state_dict()
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key


# -- 2: checkpoint layouts transformers converts on load -----------------------------------------


@pytest.mark.parametrize(
    ("build", "hub_key"),
    [
        (_mixtral, "model.layers.0.block_sparse_moe.experts.3.w1.weight"),
        (_qwen2_moe, "model.layers.0.mlp.experts.3.gate_proj.weight"),
        (_gpt_neox, "embed_out.weight"),
    ],
    ids=["mixtral", "qwen2_moe", "gpt_neox"],
)
def test_hub_layouts_load_as_from_pretrained_loads_them(
    build: Any, hub_key: str, tmp_path: Path
) -> None:
    """save_pretrained writes the Hub's layout (per-expert tensors, ``embed_out``), which the
    model's own state dict does not have: the load converts it as from_pretrained does."""
    directory = _saved(build(), tmp_path / "model")
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), framework="pt") as saved:
        assert hub_key in saved.keys()  # noqa: SIM118
    _assert_loads_as_from_pretrained(directory)


def test_a_converted_layout_still_refuses_another_model(tmp_path: Path) -> None:
    """The conversion does not hide a real mismatch: the message names the model's tensors."""
    directory = _saved(_mixtral(), tmp_path / "model")
    source = initial_weights(f"hf:{directory}", None)
    assert source is not None
    fewer = build_model(f"hf:{directory}", {"num_local_experts": 2}, meta=True).module
    with pytest.raises(UsageProblem, match=r"model.layers.0.mlp.experts.gate_up_proj \(4, "):
        check_shapes(fewer, source, "m")


def test_our_own_checkpoint_of_a_converted_model_loads(tmp_path: Path) -> None:
    """A state dict in the model's own (fused) layout, as our trainer saves it, is not
    converted a second time."""
    model = _perturbed(_mixtral())
    path = tmp_path / "state.pt"
    torch.save({"model": model.state_dict()}, path)
    adapter = build_model(f"hf:{_saved(_mixtral(), tmp_path / 'cfg')}")
    load_weights(adapter.module, weights_file(path), "m")
    for key, value in model.state_dict().items():
        assert torch.equal(adapter.module.state_dict()[key], value), key


# -- 5: saved copies of non-persistent buffers --------------------------------------------------


def test_legacy_rotary_buffers_are_accepted_and_not_loaded(tmp_path: Path) -> None:
    """Llama files converted in 2023 hold ``rotary_emb.inv_freq`` per layer; transformers now
    keeps one non-persistent copy at ``model.rotary_emb``. from_pretrained ignores them."""
    model = _perturbed(_llama())
    directory = tmp_path / "legacy"
    model.config.save_pretrained(directory)
    state = dict(model.state_dict())
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.full((4,), 7.0)
    torch.save(state, directory / "pytorch_model.bin")
    _assert_loads_as_from_pretrained(directory)
    adapter = build_model(f"hf:{directory}")
    source = initial_weights(f"hf:{directory}", None)
    assert source is not None
    loaded = load_weights(adapter.module, source, "m")
    assert loaded.num_tensors == len(model.state_dict())
    assert not torch.equal(adapter.module.model.rotary_emb.inv_freq, torch.full((4,), 7.0))


class Rotary(nn.Module):
    """A custom model whose rotary table is a non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("cos", torch.ones(4), persistent=False)


def test_a_non_persistent_buffer_in_the_file_is_not_loaded(tmp_path: Path) -> None:
    saved = {**Rotary().state_dict(), "cos": torch.zeros(4)}
    path = tmp_path / "w.pt"
    torch.save(saved, path)
    module = Rotary()
    assert load_weights(module, weights_file(path), "rotary").num_tensors == 2
    assert torch.equal(module.cos, torch.ones(4))  # computed by the model, not loaded
    torch.save({**saved, "other": torch.zeros(4)}, path)  # anything else is still refused
    with pytest.raises(UsageProblem, match=r"1 unexpected \(other\)"):
        load_weights(Rotary(), weights_file(path), "rotary")


# -- 6: the fix an hf:DIR mismatch names --------------------------------------------------------


def test_the_fix_blames_config_json_when_no_model_arg_was_given(tmp_path: Path) -> None:
    directory = _saved(_llama(), tmp_path / "model")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    with pytest.raises(UsageProblem) as refused:
        check_initial_weights(f"hf:{directory}", {}, None)
    assert str(refused.value).endswith(
        f"{directory}/config.json and the weights in {directory} disagree: put the config.json "
        "the weights were saved with beside them, or build from the config alone (random init) "
        f"with --model hf:{directory}/config.json"
    )
    assert "--model-arg" not in str(refused.value)
    result = CliRunner().invoke(
        main, ["train", "--model", f"hf:{directory}", *TRAIN, "--out", str(tmp_path / "run")]
    )
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.rstrip().endswith(str(refused.value).split(": ", 2)[-1])
    given = weights_fix(f"hf:{directory}", None, {"num_hidden_layers": 2})
    assert given.startswith(f"{directory}'s weights are of the model its config.json describes")


# -- 8: untied weights into a tied model --------------------------------------------------------


def test_untied_weights_into_a_tied_model_are_refused(tmp_path: Path) -> None:
    untied = _saved(_llama(tie_word_embeddings=False), tmp_path / "untied")
    tied = tmp_path / "tied"
    _llama(tie_word_embeddings=True).config.save_pretrained(tied)
    source = initial_weights(f"hf:{untied}", None)
    assert source is not None
    check_shapes(build_model(f"hf:{tied}", meta=True).module, source, "m")  # no values: the load
    with pytest.raises(UsageProblem) as refused:
        load_weights(build_model(f"hf:{tied}").module, source, "m")
    assert str(refused.value) == (
        f"{untied}/model.safetensors holds two different tensors, model.embed_tokens.weight and "
        "lm_head.weight, for one tensor that m ties (shares): build the model untied "
        "(--model-arg tie_word_embeddings=false) to load both, or pass weights saved from a "
        "tied model"
    )
    untie = build_model(f"hf:{tied}", {"tie_word_embeddings": False}).module
    load_weights(untie, source, "m")  # the fix it names
    out = ["--out", str(tmp_path / "run")]
    args = ["train", "--model", f"hf:{tied}", "--init-from", str(untied), *TRAIN, *out]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "holds two different tensors" in result.stderr


def test_a_tied_model_saved_under_both_names_loads(tmp_path: Path) -> None:
    model = _perturbed(_llama(tie_word_embeddings=True))
    state = model.state_dict()
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= state.keys()
    path = tmp_path / "tied.pt"
    torch.save(state, path)
    module = _llama(tie_word_embeddings=True)
    load_weights(module, weights_file(path), "m")
    assert torch.equal(module.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_our_models_name_their_own_untie_arg(tmp_path: Path) -> None:
    args = {"n_layer": 1, "n_embd": 32, "tie_weights": False}
    path = tmp_path / "untied.pt"
    torch.save(_perturbed(build_model("gpt-tiny", args).module).state_dict(), path)
    tied = build_model("gpt-tiny", {"n_layer": 1, "n_embd": 32}).module
    with pytest.raises(UsageProblem, match=r"\(--model-arg tie_weights=false\) to load both"):
        load_weights(tied, weights_file(path), "gpt-tiny")
