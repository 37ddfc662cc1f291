"""The stand-in MoE model is built byte for byte the same each time, as a Qwen3-MoE
checkpoint carrying the qwen3 tiny family's tokenizer and template."""

import json
from pathlib import Path

from safetensors.numpy import load_file

from devstack.reference_moe import MOE_FAMILY, MoeShape, build_moe_model
from devstack.tiny_families import ensure_family_model
from gateway.parsers.selection import detect_family


def test_two_builds_are_identical_and_shaped_as_qwen3_moe(tmp_path: Path) -> None:
    first, second = build_moe_model(tmp_path / "a"), build_moe_model(tmp_path / "b")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    config = json.loads((first / "config.json").read_text())
    shape = MoeShape()
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert (config["num_experts"], config["num_experts_per_tok"]) == (8, 2)
    tensors = load_file(first / "model.safetensors")
    assert {t.dtype.name for t in tensors.values()} == {"float32"}
    for layer in range(shape.num_hidden_layers):
        assert tensors[f"model.layers.{layer}.mlp.gate.weight"].shape == (8, shape.hidden_size)
    family = ensure_family_model(MOE_FAMILY)
    assert (first / "tokenizer.json").read_bytes() == (family / "tokenizer.json").read_bytes()
    template = json.loads((first / "tokenizer_config.json").read_text())["chat_template"]
    assert detect_family(template) == MOE_FAMILY
