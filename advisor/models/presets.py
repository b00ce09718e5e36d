"""Built-in model presets: name -> (family, config fields). Shapes follow the published models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Preset:
    family: str  # gpt | bert | llama
    config: dict[str, Any]
    description: str


PRESETS: dict[str, Preset] = {
    # Byte-level vocabulary so the embedded corpus (vocab 256) trains it directly.
    "gpt-tiny": Preset(
        "gpt",
        dict(vocab_size=256, n_layer=4, n_head=4, n_embd=256, block_size=512),
        "4-layer GPT, 3.3M params: the CPU demo default",
    ),
    # GPT-2 shapes (Radford et al. 2019, Table 2): 124M / 350M / 774M / 1558M.
    "gpt-small": Preset("gpt", dict(n_layer=12, n_head=12, n_embd=768), "GPT-2 124M shape"),
    "gpt-medium": Preset("gpt", dict(n_layer=24, n_head=16, n_embd=1024), "GPT-2 350M shape"),
    "gpt-large": Preset("gpt", dict(n_layer=36, n_head=20, n_embd=1280), "GPT-2 774M shape"),
    "gpt-xl": Preset("gpt", dict(n_layer=48, n_head=25, n_embd=1600), "GPT-2 1.5B shape"),
    # BERT-tiny shape (Turc et al. 2019: L=2, H=128); vocab = 256 bytes + specials, [MASK] last.
    "bert-tiny": Preset(
        "bert",
        dict(vocab_size=320, n_layer=2, n_head=2, n_embd=128, ffn_hidden=512, max_position=512),
        "2-layer BERT encoder with masked-LM loss",
    ),
    "bert-base": Preset("bert", {}, "BERT-base 110M shape, masked-LM loss ([MASK] = last id)"),
    "llama-tiny": Preset(
        "llama",
        dict(
            vocab_size=256,
            n_layer=4,
            n_head=4,
            n_kv_head=2,
            n_embd=256,
            ffn_hidden=688,
            max_seq_len=1024,
            rope_theta=10000.0,
        ),
        "4-layer Llama (RMSNorm, SwiGLU, RoPE, GQA)",
    ),
    # Llama 3.2 1B shape (Meta model card: 16 layers, d=2048, 32 heads, 8 KV heads, tied).
    "llama-1b": Preset("llama", {}, "Llama-3.2-1B shape"),
}
