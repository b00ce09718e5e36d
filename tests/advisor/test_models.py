"""Model specs: presets, ``hf:`` configs, user factories, the adapter and the objectives."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from advisor.errors import UsageProblem
from advisor.models import PRESETS, ModelAdapter, build_model, parse_model_args
from advisor.models.objectives import IGNORE_INDEX, Objective, lm_loss, mask_tokens

DATA = Path(__file__).resolve().parents[1] / "data"
USER_FILE = DATA / "user_model.py"

# Published parameter counts (GPT-2: Radford et al. 2019; BERT: Devlin et al. 2018; Llama 3.2
# 1B: Meta's model card) and depths.
PUBLISHED = {
    "gpt-small": (124e6, 12),
    "gpt-medium": (355e6, 24),
    "gpt-large": (774e6, 36),
    "gpt-xl": (1558e6, 48),
    "bert-base": (110e6, 12),
    "llama-1b": (1.24e9, 16),
}
TINY = {  # real (allocated) versions small enough for a forward and backward in milliseconds
    "gpt-tiny": {"n_layer": 1},
    "bert-tiny": {"n_layer": 1},
    "llama-tiny": {"n_layer": 1},
}


def one_line_problem(excinfo: pytest.ExceptionInfo[UsageProblem]) -> str:
    message = str(excinfo.value)
    assert message and "\n" not in message, repr(message)
    return message


def random_batch(
    adapter: ModelAdapter, batch: int = 2, seq_len: int = 16, seed: int = 0
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    window = torch.randint(min(adapter.vocab_size, 256), (batch, seq_len + 1), generator=gen)
    return adapter.make_objective(min(adapter.vocab_size, 256)).example(window, gen)


# -- presets ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_on_meta_without_memory(name: str) -> None:
    adapter = build_model(name, meta=True)
    assert all(p.is_meta for p in adapter.module.parameters())
    facts = adapter.facts()
    assert facts.num_layers == len(adapter.blocks()) > 0
    assert facts.block_class == type(adapter.blocks()[0]).__name__
    assert facts.num_params == facts.num_trainable_params > 0


def test_a_meta_build_skips_the_initialisers_and_never_imports_the_compiler(
    tmp_path: Path,
) -> None:
    """A meta build (the launcher's host-memory check, a workload's facts) has no values to
    initialise: it must not pay torch._dynamo's ~4 s import, which torch's Python references
    for a meta ``normal_`` or ``arange`` would start. A fresh interpreter, for sys.modules."""
    user = tmp_path / "inits.py"
    user.write_text(
        "import torch\n"
        "from torch import nn\n"
        "def model():\n"
        "    m = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))\n"
        "    nn.init.trunc_normal_(m[1].weight, std=0.02)\n"
        "    m[0].weight.data.normal_(0.0, 0.02)\n"
        "    m[1].bias.data.uniform_(-1.0, 1.0)\n"
        "    m.cpu_table = torch.zeros(4, device='cpu')\n"
        "    nn.init.ones_(m.cpu_table)  # a real tensor: still initialised\n"
        "    return m\n"
    )
    code = (
        "import sys\n"
        "from advisor.models import PRESETS, build_model\n"
        f"specs = [*PRESETS, {str(user) + ':model'!r}]\n"
        "params = {s: sum(p.numel() for p in build_model(s, meta=True).module.parameters())"
        " for s in specs}\n"
        "user = build_model(specs[-1], meta=True).module\n"
        "assert all(p.is_meta for p in user.parameters())\n"
        "assert user.cpu_table.tolist() == [1.0] * 4\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')), params)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    imported, _, counts = proc.stdout.partition(" ")
    assert imported == "[]", proc.stdout
    # The same parameters as the real build (the presets' published sizes are checked below).
    real = build_model(str(user) + ":model")
    assert f"{str(user) + ':model'!r}: {sum(p.numel() for p in real.module.parameters())}" in counts
    assert real.module[0].weight.std() < 0.1  # a real build still runs the initialisers
    assert real.module.cpu_table.tolist() == [1.0] * 4


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("nn.init.kaiming_uniform_(m[1].bias)", "Fan in and fan out can not be computed"),
        ("m[1].weight.uniform_(1.0, -1.0)", "a leaf Variable that requires grad"),
        ("nn.init.normal_(m[1].weight, std=-1.0)", "normal expects std >= 0.0"),
    ],
    ids=["fan-of-a-vector", "in-place-on-a-leaf", "negative-std"],
)
def test_a_meta_build_refuses_the_initialiser_a_real_build_refuses(
    tmp_path: Path, line: str, error: str
) -> None:
    """The initialisers a meta build skips are still checked (on a small CPU stand-in): a
    factory a real build refuses is refused before a profile or a launch starts."""
    user = tmp_path / "broken.py"
    user.write_text(
        "from torch import nn\n"
        "def model():\n"
        "    m = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))\n"
        f"    {line}\n"
        "    return m\n"
    )
    for meta in (False, True):
        with pytest.raises(UsageProblem, match=error):
            build_model(f"{user}:model", meta=meta)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_matches_published_size(name: str) -> None:
    published_params, published_layers = PUBLISHED[name]
    facts = build_model(name, meta=True).facts()
    assert facts.num_params == pytest.approx(published_params, rel=0.01)
    assert facts.num_layers == published_layers
    assert facts.tied_embeddings  # the published models share input and output embeddings


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_models_forward_and_backward(name: str) -> None:
    torch.manual_seed(0)
    adapter = build_model(name, TINY[name])
    batch = random_batch(adapter)
    logits = adapter.logits(batch["input_ids"])
    assert logits.shape == (2, 16, adapter.vocab_size)
    loss = adapter.loss(batch)
    assert torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in adapter.module.parameters())


def test_gpt_tiny_initial_loss_is_uniform_guess() -> None:
    # A well-initialised LM starts near a uniform prediction: cross-entropy ln(vocab).
    torch.manual_seed(0)
    adapter = build_model("gpt-tiny")
    with torch.no_grad():
        loss = adapter.loss(random_batch(adapter, batch=4, seq_len=64))
    assert loss.item() == pytest.approx(math.log(adapter.vocab_size), abs=0.1)


@pytest.mark.parametrize("name", sorted(TINY))
def test_meta_to_empty_retie_keeps_tied_weights_and_function(name: str) -> None:
    meta = build_model(name, TINY[name], meta=True)
    num_params = meta.facts().num_params
    meta.module.to_empty(device="cpu")
    meta.retie()
    facts = meta.facts()
    assert facts.tied_embeddings
    assert facts.num_params == num_params  # a broken tie would count the embedding twice
    meta.init_weights()
    real = build_model(name, TINY[name])
    # Non-parameter state (Llama's RoPE tables) is rebuilt by init_weights, not left garbage.
    for (key, got), (_, want) in zip(
        meta.module.named_buffers(), real.module.named_buffers(), strict=True
    ):
        torch.testing.assert_close(got, want, msg=key)
    with torch.no_grad():
        loss = meta.loss(random_batch(meta))
    assert loss.item() == pytest.approx(math.log(meta.vocab_size), abs=0.3)


def test_model_args_override_preset_fields() -> None:
    facts = build_model("gpt-small", {"n_layer": 1, "block_size": 128}, meta=True).facts()
    assert (facts.num_layers, facts.max_seq_len, facts.hidden_size) == (1, 128, 768)


def test_unknown_model_arg_names_the_valid_fields() -> None:
    with pytest.raises(UsageProblem) as excinfo:
        build_model("gpt-tiny", {"n_layers": 2}, meta=True)
    message = one_line_problem(excinfo)
    assert "n_layers" in message
    assert "n_layer" in message.split("choose from", 1)[1]


def test_inconsistent_llama_shape_is_a_usage_problem() -> None:
    with pytest.raises(UsageProblem) as excinfo:
        build_model("llama-tiny", {"n_kv_head": 3}, meta=True)
    assert "n_kv_head" in one_line_problem(excinfo)


@pytest.mark.parametrize("name", ["gpt-tiny", "bert-tiny"])
def test_heads_not_dividing_width_is_a_usage_problem(name: str) -> None:
    with pytest.raises(UsageProblem):
        build_model(name, {"n_head": 3}, meta=True)


def _size_fields() -> list[tuple[str, str]]:
    """(preset, field) for every integer field of each family's config: a new one is checked."""
    from advisor.models.bert import BertConfig
    from advisor.models.gpt import GPTConfig
    from advisor.models.llama import LlamaConfig

    configs = {"gpt-tiny": GPTConfig, "bert-tiny": BertConfig, "llama-tiny": LlamaConfig}
    return [
        (name, f.name)
        for name, config in configs.items()
        for f in dataclasses.fields(config)
        if f.type == "int"
    ]


@pytest.mark.parametrize("value", [0, -1])
@pytest.mark.parametrize(("name", "field"), _size_fields())
def test_a_size_below_one_is_a_usage_problem_naming_the_field(
    name: str, field: str, value: int
) -> None:
    """n_layer=0 divided by zero in init; n_layer=-1 built a block-less model whose every
    profile probe failed; a zero width or vocab failed at the first step."""
    for meta in (True, False):
        with pytest.raises(UsageProblem) as excinfo:
            build_model(name, {field: value}, meta=meta)
        assert one_line_problem(excinfo) == (
            f"--model-arg {field}={value}: {field} must be at least 1"
        )


@pytest.mark.parametrize("value", ["abc", 2.5, True, None])
def test_a_size_that_is_not_a_whole_number_is_a_usage_problem(value: object) -> None:
    with pytest.raises(UsageProblem) as excinfo:
        build_model("gpt-tiny", {"n_layer": value}, meta=True)
    assert one_line_problem(excinfo) == (
        f"--model-arg n_layer={value}: n_layer must be a whole number of at least 1"
    )


@pytest.mark.parametrize("mask", [-1, 320, "x"])
def test_a_mask_token_outside_the_vocabulary_is_a_usage_problem(mask: object) -> None:
    """bert-tiny's vocabulary is 320 ids; an id outside it failed at the first step."""
    with pytest.raises(UsageProblem) as excinfo:
        build_model("bert-tiny", {"mask_token_id": mask}, meta=True)
    assert one_line_problem(excinfo) == (
        f"--model-arg mask_token_id={mask}: mask_token_id must be a token id from 0 to 319 "
        "(vocab_size - 1, the default)"
    )
    assert build_model("bert-tiny", {"mask_token_id": 319}, meta=True).mask_token_id == 319


def test_an_odd_llama_head_dimension_is_a_usage_problem() -> None:
    """RoPE rotates pairs: width 12 over 4 heads (3 each) failed at the first step."""
    with pytest.raises(UsageProblem) as excinfo:
        build_model("llama-tiny", {"n_embd": 12}, meta=True)
    assert "n_embd / n_head (12 / 4) must be even" in one_line_problem(excinfo)


@pytest.mark.parametrize(
    ("name", "field"),
    [("gpt-tiny", "block_size"), ("bert-tiny", "max_position"), ("llama-tiny", "max_seq_len")],
)
def test_sequence_longer_than_model_maximum_says_how_to_fix(name: str, field: str) -> None:
    adapter = build_model(name, {"n_layer": 1, field: 8})
    assert adapter.facts().max_seq_len == 8
    with pytest.raises(ValueError, match=rf"--seq-len or --model-arg {field}=9"):
        adapter.logits(torch.zeros(1, 9, dtype=torch.long))


def test_a_factory_that_needs_arguments_none_were_given_says_how_to_pass_them() -> None:
    with pytest.raises(UsageProblem) as caught:
        build_model("os.path:join")
    assert str(caught.value).startswith("os.path:join can't be called with no arguments (")
    assert str(caught.value).endswith("pass its parameters with --model-arg KEY=VALUE")
    with pytest.raises(UsageProblem, match=r"^--model-arg does not fit os.path:join \("):
        build_model("os.path:join", {"nope": 1})


def test_a_config_saved_by_transformers_with_an_infinite_field_builds(tmp_path: Path) -> None:
    """transformers writes float('inf') as {"__float__": "Infinity"} (Mamba-2 families'
    time_step_limit) and reads it back; passed on raw, the config did not validate."""
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(
        "mamba2", vocab_size=256, hidden_size=64, num_hidden_layers=2, num_heads=4,
        head_dim=32, n_groups=1, state_size=16,
    )  # fmt: skip
    config.save_pretrained(tmp_path)
    assert '"__float__": "Infinity"' in (tmp_path / "config.json").read_text()
    adapter = build_model(f"hf:{tmp_path}", meta=True)
    assert adapter.module.config.time_step_limit[1] == math.inf


@pytest.mark.parametrize("model_type", ["bart", "t5"])
def test_an_encoder_decoder_model_is_refused_not_trained_as_a_masked_lm(model_type: str) -> None:
    """BART has a masked-LM mapping (its seq2seq model): it trained as an "encoder" with its
    decoder fed the masked input, silently; T5 was refused for want of a head."""
    pytest.importorskip("transformers")
    with pytest.raises(UsageProblem) as caught:
        build_model(f"hf:{model_type}", meta=True)
    assert str(caught.value) == (
        f"hf model type {model_type!r} is an encoder-decoder (seq2seq) model: the advisor "
        "trains decoder-only (causal LM) and encoder-only (masked LM) models; use one of those"
    )


def test_unknown_spec_lists_the_choices() -> None:
    with pytest.raises(UsageProblem) as excinfo:
        build_model("gpt-huge")
    message = one_line_problem(excinfo)
    assert "gpt-tiny" in message and "hf:" in message


def test_objective_override_turns_a_decoder_into_mlm() -> None:
    adapter = build_model("gpt-tiny", {"objective": "mlm", "n_layer": 1}, meta=True)
    assert adapter.objective == "mlm"
    assert adapter.mask_token_id == adapter.vocab_size - 1
    with pytest.raises(UsageProblem, match="causal_lm or mlm"):
        build_model("gpt-tiny", {"objective": "seq2seq"}, meta=True)


def test_parse_model_args_reads_json_literals_and_rejects_malformed_pairs() -> None:
    parsed = parse_model_args(["n_layer=2", "bias=false", "dropout=0.1", "name=abc", "x=None"])
    assert parsed == {"n_layer": 2, "bias": False, "dropout": 0.1, "name": "abc", "x": None}
    with pytest.raises(UsageProblem, match="KEY=VALUE"):
        parse_model_args(["n_layer"])


# -- hf: ----------------------------------------------------------------------------------------

HF_TINY = {
    "hf:gpt2": {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 256},
    "hf:bert": {
        "num_hidden_layers": 1,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "vocab_size": 256,
    },
    "hf:llama": {
        "num_hidden_layers": 1,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 64,
        "vocab_size": 256,
    },
}


@pytest.fixture(scope="module")
def transformers_installed() -> None:
    pytest.importorskip("transformers")


@pytest.mark.usefixtures("transformers_installed")
@pytest.mark.parametrize(
    ("spec", "objective", "blocks"),
    [
        ("hf:gpt2", "causal_lm", "transformer.h"),
        ("hf:bert", "mlm", "bert.encoder.layer"),
        ("hf:llama", "causal_lm", "model.layers"),
    ],
)
def test_hf_model_type_builds_from_config_and_trains(
    spec: str, objective: str, blocks: str
) -> None:
    torch.manual_seed(0)
    adapter = build_model(spec, HF_TINY[spec])
    facts = adapter.facts()
    assert (adapter.objective, adapter.blocks_path) == (objective, blocks)
    assert (facts.num_layers, facts.hidden_size, facts.vocab_size) == (1, 32, 256)
    if objective == "mlm":
        assert adapter.mask_token_id is not None
    batch = random_batch(adapter)
    if objective == "mlm":
        assert (batch["labels"] == IGNORE_INDEX).any()
    loss = adapter.loss(batch)  # HF returns a ModelOutput: the adapter takes its .logits
    assert loss.item() == pytest.approx(math.log(256), abs=0.5)
    loss.backward()


@pytest.mark.usefixtures("transformers_installed")
def test_hf_overrides_reach_the_fields_a_config_derives_from_them() -> None:
    """--model-arg goes through the config's constructor: Llama derives head_dim from hidden
    and heads, DeepSeek-V3 its head dims from the rope and nope dims. Set on a built config,
    the overrides left them at the defaults' (Llama's heads 4096 / 32 = 128 wide)."""
    llama = build_model("hf:llama", HF_TINY["hf:llama"], meta=True).module
    assert llama.config.head_dim == 16
    assert llama.model.layers[0].self_attn.q_proj.out_features == 32
    deepseek = {
        "hidden_size": 32,
        "intermediate_size": 48,
        "moe_intermediate_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "vocab_size": 64,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "q_lora_rank": 16,
        "kv_lora_rank": 8,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 8,
    }
    torch.manual_seed(0)
    adapter = build_model("hf:deepseek_v3", deepseek)
    assert adapter.module.config.qk_head_dim == 16
    adapter.loss(random_batch(adapter)).backward()  # failed in rotary before


@pytest.mark.usefixtures("transformers_installed")
@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"hidden_size": "wide"}, "expected int"),
        ({"hidden_size": 30, "num_attention_heads": 4}, "not a multiple"),
    ],
)
def test_hf_overrides_the_config_refuses_are_one_line_usage_problems(
    args: dict[str, object], words: str
) -> None:
    with pytest.raises(UsageProblem) as excinfo:
        build_model("hf:llama", args, meta=True)
    line = one_line_problem(excinfo)
    assert line.startswith("hf:llama: LlamaConfig refuses these --model-arg values")
    assert words in line


@pytest.mark.usefixtures("transformers_installed")
def test_hf_override_of_a_field_only_the_modeling_code_reads_is_taken() -> None:
    """Qwen3MoeConfig() keeps no head_dim, yet its attention reads getattr(config, "head_dim",
    hidden // heads) and Qwen3-30B-A3B's config.json sets 128: --model-arg head_dim was refused
    as "not a field". A name the modeling code never reads is still refused."""
    args = {**TINY_DECODER, "moe_intermediate_size": 16, "num_experts": 4, "head_dim": 24}
    attention = build_model("hf:qwen3_moe", args, meta=True).module.model.layers[0].self_attn
    assert attention.head_dim == 24
    assert attention.q_proj.out_features == 2 * 24
    with pytest.raises(UsageProblem) as excinfo:
        build_model("hf:qwen3_moe", {**args, "head_dimz": 24}, meta=True)
    assert one_line_problem(excinfo) == (
        "--model-arg head_dimz is not a field of Qwen3MoeConfig: check the config's attribute names"
    )


# A one-layer decoder most hf model types accept as --model-arg overrides.
TINY_DECODER = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 64,
}
# A two-layer Mixtral: 2 of 4 experts per token, gated experts 64 -> 2 x 96 -> 64.
TINY_MIXTRAL = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 64,
}


@pytest.mark.usefixtures("transformers_installed")
def test_a_vocabulary_shrunk_below_the_padding_id_names_the_fix() -> None:
    args = TINY_DECODER
    with pytest.raises(UsageProblem) as excinfo:
        build_model("hf:phi3", args, meta=True)
    line = one_line_problem(excinfo)
    assert line.startswith("cannot build hf:phi3 (")
    assert line.endswith(
        "its pad_token_id 32000 is not below vocab_size 64; pass --model-arg pad_token_id=0 "
        "(or a larger vocab_size)"
    )
    assert build_model("hf:phi3", {**args, "pad_token_id": 0}, meta=True).vocab_size == 64


@pytest.mark.usefixtures("transformers_installed")
def test_an_architecture_without_an_sdpa_path_builds_with_eager_attention() -> None:
    """Gemma 2 (logit soft-capping) has no SDPA path in transformers; it was refused."""
    adapter = build_model("hf:gemma2", {**TINY_DECODER, "head_dim": 16})
    assert adapter.module.config._attn_implementation == "eager"
    adapter.loss(random_batch(adapter)).backward()
    llama = build_model("hf:llama", HF_TINY["hf:llama"], meta=True).module
    assert llama.config._attn_implementation == "sdpa"


@pytest.mark.usefixtures("transformers_installed")
def test_hf_full_size_config_on_meta_has_published_size() -> None:
    facts = build_model("hf:gpt2", meta=True).facts()
    assert facts.num_params == pytest.approx(124e6, rel=0.01)
    assert facts.tied_embeddings


@pytest.mark.usefixtures("transformers_installed")
def test_hf_local_config_dir_and_file() -> None:
    gpt2 = build_model(f"hf:{DATA / 'hf_tiny_gpt2'}", {"n_layer": 1}).facts()
    assert (gpt2.family, gpt2.num_layers, gpt2.vocab_size, gpt2.max_seq_len) == (
        "hf-gpt2",
        1,  # the override wins over the file's 2 layers
        128,
        64,
    )
    bert = build_model(f"hf:{DATA / 'hf_tiny_bert_config.json'}", meta=True)
    assert (bert.objective, bert.vocab_size, len(bert.blocks())) == ("mlm", 96, 2)


@pytest.mark.usefixtures("transformers_installed")
@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        ("hf:openai-community/gpt2", "save the model's config.json locally"),
        ("hf:no-such-type", "use a model type such as gpt2"),
        ("hf:vit", "decoder or encoder language model"),  # no LM head
    ],
)
def test_hf_unusable_name_says_how_to_fix(spec: str, hint: str) -> None:
    with pytest.raises(UsageProblem) as excinfo:
        build_model(spec, meta=True)
    assert hint in one_line_problem(excinfo)


@pytest.mark.usefixtures("transformers_installed")
def test_hf_bad_local_configs(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "alien.json").write_text('{"model_type": "no-such-type"}')
    (tmp_path / "untyped.json").write_text('{"n_layer": 2}')
    # a damaged config.json in a model directory ended in a JSONDecodeError traceback
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "config.json").write_text('{"model_type": "gpt2",')
    cases = {
        "empty": "config.json",
        "broken.json": "not valid JSON",
        "damaged": "damaged/config.json is not valid JSON",
        "alien.json": "has unknown model_type 'no-such-type': set it to a transformers model type",
        "untyped.json": "has no model_type: set it to a transformers model type",
    }
    for name, hint in cases.items():
        with pytest.raises(UsageProblem) as excinfo:
            build_model(f"hf:{tmp_path / name}", meta=True)
        assert hint in one_line_problem(excinfo)
        # the lazy CONFIG_MAPPING's len() is 0: the count is of its keys
        assert " knows 0 " not in one_line_problem(excinfo)


@pytest.mark.usefixtures("transformers_installed")
def test_hf_unknown_model_arg_is_a_usage_problem() -> None:
    with pytest.raises(UsageProblem) as excinfo:
        build_model("hf:gpt2", {"num_layers": 1}, meta=True)
    message = one_line_problem(excinfo)
    assert "num_layers" in message and "GPT2Config" in message


def test_hf_without_transformers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails
    with pytest.raises(UsageProblem) as excinfo:
        build_model("hf:gpt2", meta=True)
    assert "pip install 'transformer-advisor[hf]'" in one_line_problem(excinfo)


# -- user factories ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target", [str(USER_FILE), "tests.data.user_model"], ids=["file", "module"]
)
def test_user_factory_gets_model_args_as_kwargs(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(DATA.parents[1]))
    adapter = build_model(f"{target}:tiny_lm", {"vocab_size": 50, "dim": 8, "n_layers": 3})
    facts = adapter.facts()
    assert (facts.family, facts.vocab_size, facts.hidden_size, facts.num_layers) == (
        "custom",
        50,
        8,
        3,
    )
    assert adapter.blocks_path == "layers"
    batch = random_batch(adapter)
    assert batch["input_ids"].max() < 50
    adapter.loss(batch).backward()


def test_user_factory_builds_on_meta() -> None:
    adapter = build_model(f"{USER_FILE}:tiny_lm", meta=True)
    assert all(p.is_meta for p in adapter.module.parameters())


def test_user_factory_returning_output_with_logits_trains() -> None:
    adapter = build_model(f"{USER_FILE}:logits_output_lm")
    loss = adapter.loss(random_batch(adapter))
    loss.backward()
    assert torch.isfinite(loss)


def test_user_module_can_name_its_blocks() -> None:
    adapter = build_model(f"{USER_FILE}:named_blocks_lm", meta=True)
    assert adapter.blocks_path == "adapters"
    assert adapter.facts().num_layers == 3


@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        (f"{USER_FILE}:not_a_module", "not a torch.nn.Module"),
        (f"{USER_FILE}:raises", "RuntimeError: out of coffee"),
        (f"{USER_FILE}:wrong_named_blocks", "names 'head', which is not an nn.ModuleList"),
        (f"{USER_FILE}:missing", "no callable 'missing'"),
        (f"{USER_FILE}:NOT_CALLABLE", "no callable 'NOT_CALLABLE'"),
        (f"{DATA / 'no_such_file.py'}:f", "does not exist"),
        ("no_such_package_xyz.models:f", "PYTHONPATH"),
    ],
    ids=[
        "non-module",
        "raises",
        "wrong-blocks",
        "missing-attr",
        "not-callable",
        "no-file",
        "no-pkg",
    ],
)
def test_user_factory_failures_are_one_line_usage_problems(spec: str, hint: str) -> None:
    with pytest.raises(UsageProblem) as excinfo:
        build_model(spec, meta=True)
    assert hint in one_line_problem(excinfo)


def test_user_factory_with_unexpected_arg_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(UsageProblem) as excinfo:
        build_model(f"{USER_FILE}:tiny_lm", {"width": 8}, meta=True)
    assert "width" in one_line_problem(excinfo)
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    with pytest.raises(UsageProblem) as excinfo:
        build_model(f"{broken}:f")
    assert "SyntaxError" in one_line_problem(excinfo)


def test_factory_raising_a_multi_line_error_still_gives_one_line(tmp_path: Path) -> None:
    factory = tmp_path / "chatty.py"
    factory.write_text("def build():\n    raise ValueError('bad shape\\nsee the docs')\n")
    with pytest.raises(UsageProblem) as excinfo:
        build_model(f"{factory}:build")
    assert "bad shape" in one_line_problem(excinfo)


# -- objectives -------------------------------------------------------------------------------


def test_causal_objective_shifts_by_one() -> None:
    window = torch.arange(10).reshape(2, 5)
    example = Objective("causal_lm").example(window, torch.Generator())
    assert example["input_ids"].tolist() == [[0, 1, 2, 3], [5, 6, 7, 8]]
    assert example["labels"].tolist() == [[1, 2, 3, 4], [6, 7, 8, 9]]


def test_mlm_masking_statistics() -> None:
    vocab, mask_id = 1000, 999
    tokens = torch.randint(mask_id, (512, 512), generator=torch.Generator().manual_seed(1))
    out = mask_tokens(tokens, mask_id, vocab, torch.Generator().manual_seed(2))
    chosen = out["labels"] != IGNORE_INDEX
    num_chosen = int(chosen.sum())
    assert num_chosen / tokens.numel() == pytest.approx(0.15, abs=0.005)
    # Labels carry the original token where chosen; inputs are untouched elsewhere.
    assert torch.equal(out["labels"][chosen], tokens[chosen])
    assert torch.equal(out["input_ids"][~chosen], tokens[~chosen])
    inputs = out["input_ids"][chosen]
    masked = (inputs == mask_id).sum().item() / num_chosen
    kept = (inputs == tokens[chosen]).sum().item() / num_chosen
    randomized = 1 - masked - kept
    assert masked == pytest.approx(0.8, abs=0.01)
    assert kept == pytest.approx(0.1, abs=0.01)
    assert randomized == pytest.approx(0.1, abs=0.01)


def test_mlm_is_deterministic_per_generator_seed() -> None:
    objective = Objective("mlm", data_vocab_size=256, mask_token_id=255)
    window = torch.randint(255, (4, 65), generator=torch.Generator().manual_seed(0))
    first = objective.example(window, torch.Generator().manual_seed(7))
    again = objective.example(window, torch.Generator().manual_seed(7))
    other = objective.example(window, torch.Generator().manual_seed(8))
    assert first["input_ids"].shape == (4, 64)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["labels"], other["labels"])


def test_mlm_always_labels_at_least_one_token() -> None:
    tokens = torch.zeros(1, 2, dtype=torch.long)
    for seed in range(50):
        out = mask_tokens(tokens, 255, 256, torch.Generator().manual_seed(seed))
        assert (out["labels"] != IGNORE_INDEX).any()


def test_lm_loss_ignores_unlabelled_positions() -> None:
    logits = torch.randn(1, 3, 5)
    labels = torch.tensor([[2, IGNORE_INDEX, 4]])
    expected = torch.nn.functional.cross_entropy(logits[0, [0, 2]], torch.tensor([2, 4]))
    assert lm_loss(logits.bfloat16(), labels).dtype == torch.float32
    torch.testing.assert_close(lm_loss(logits, labels), expected)


@pytest.mark.usefixtures("transformers_installed")
def test_hf_facts_record_a_head_width_that_is_not_hidden_over_heads() -> None:
    """The what-if prices attention and the projections at the heads' real width: a config's
    head_dim where it differs from hidden / heads (written to profile.json then only), and for
    multi-head latent attention the mean of the query/key and value widths."""
    from advisor.models.hf import _attention_head_dim, load_hf_config
    from profilers.workload import ModelFacts

    qwen = build_model("hf:qwen3", {**TINY_DECODER, "head_dim": 24}, meta=True).facts()
    assert (qwen.head_dim, qwen.attention_head_dim, qwen.to_dict()["head_dim"]) == (24, 24, 24)
    assert ModelFacts.from_dict(qwen.to_dict()) == qwen
    llama = build_model("hf:llama", TINY_DECODER, meta=True).facts()  # head_dim = 32 / 2
    assert (llama.head_dim, llama.attention_head_dim) == (0, 16)
    assert "head_dim" not in llama.to_dict()
    deepseek = load_hf_config("deepseek_v3", {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64})
    assert _attention_head_dim(deepseek) == (192 + 128) // 2
