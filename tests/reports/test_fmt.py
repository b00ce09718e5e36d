"""Formatting helpers the report and the CLI share."""

from __future__ import annotations

from reports import fmt


def test_a_model_is_labelled_by_what_was_built_not_only_its_preset() -> None:
    label = fmt.model_label("gpt-small", {"n_layer": 40, "n_embd": 5120}, 13_015_864_320)
    assert label == "gpt-small (n_layer=40, n_embd=5120; 13.02B params)"
    assert fmt.model_label("gpt-tiny", {}, 3_400_000) == "gpt-tiny (3.40M params)"
    assert fmt.model_label("hf:gpt2", None, None) == "hf:gpt2"
    assert fmt.model_label(None) == "a model"
