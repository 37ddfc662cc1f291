"""The stand-in engine's model: a tiny random Qwen3-MoE checkpoint, float32.

The tokenizer, chat template and end-of-turn ids are the ``qwen3`` tiny family's (copied
from its cached build), so the Gateway detects and renders it as that family. Weights are
drawn with a seeded numpy generator and saved with ``safetensors.numpy`` in the Hugging
Face Qwen3-MoE layout (one ``mlp.experts.E.*`` set per expert, ``mlp.gate`` the router),
which transformers loads as ``Qwen3MoeForCausalLM``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from devstack.tiny_families import ensure_family_model, family_fingerprint
from devstack.tiny_model import default_cache_dir
from devstack.tiny_model.builder import publish_cached
from devstack.tiny_model.weights import TinyQwen3Shape, hf_config, write_weights

MOE_FAMILY = "qwen3"
"""The tiny family whose tokenizer and template the MoE model carries."""

SERVED_MODEL_NAME = "tiny-qwen3-moe"
WEIGHTS_SEED = 4321
INIT_STD = 0.02
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)


class MoeShape(TinyQwen3Shape):
    """The dense tiny shape plus the MoE sizes (every layer sparse)."""

    num_hidden_layers: int = 3
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64


def moe_config(shape: MoeShape, vocab_size: int, eos: int, bos: int | None) -> dict[str, Any]:
    """``config.json`` for ``Qwen3MoeForCausalLM``."""
    config = hf_config(shape, vocab_size, eos, bos)
    config.update(
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        torch_dtype="float32",
        num_experts=shape.num_experts,
        num_experts_per_tok=shape.num_experts_per_tok,
        moe_intermediate_size=shape.moe_intermediate_size,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        output_router_logits=False,
        router_aux_loss_coef=0.001,
    )
    return config


def moe_weights(
    shape: MoeShape, vocab_size: int, seed: int = WEIGHTS_SEED
) -> dict[str, np.ndarray]:
    """Qwen3-MoE parameter names and shapes; normals with std 0.02, norms at one."""
    rng = np.random.default_rng(seed)
    h, d, m = shape.hidden_size, shape.head_dim, shape.moe_intermediate_size

    def normal(*dims: int) -> np.ndarray:
        return rng.standard_normal(dims, dtype=np.float32) * np.float32(INIT_STD)

    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(vocab_size, h)}
    for i in range(shape.num_hidden_layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
        tensors[p + "self_attn.q_proj.weight"] = normal(shape.num_attention_heads * d, h)
        tensors[p + "self_attn.k_proj.weight"] = normal(shape.num_key_value_heads * d, h)
        tensors[p + "self_attn.v_proj.weight"] = normal(shape.num_key_value_heads * d, h)
        tensors[p + "self_attn.o_proj.weight"] = normal(h, shape.num_attention_heads * d)
        tensors[p + "self_attn.q_norm.weight"] = np.ones(d, dtype=np.float32)
        tensors[p + "self_attn.k_norm.weight"] = np.ones(d, dtype=np.float32)
        # The router is drawn wider than the rest so each token has clear favourites.
        tensors[p + "mlp.gate.weight"] = normal(shape.num_experts, h) * np.float32(10.0)
        for e in range(shape.num_experts):
            q = f"{p}mlp.experts.{e}."
            tensors[q + "gate_proj.weight"] = normal(m, h)
            tensors[q + "up_proj.weight"] = normal(m, h)
            tensors[q + "down_proj.weight"] = normal(h, m)
    tensors["model.norm.weight"] = np.ones(h, dtype=np.float32)
    return tensors


def build_moe_model(out_dir: Path, shape: MoeShape | None = None) -> Path:
    """Write the family's tokenizer files, the MoE config and the weights into `out_dir`."""
    shape = shape or MoeShape()
    family_dir = ensure_family_model(MOE_FAMILY)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(family_dir / name, out_dir / name)
    dense = json.loads((family_dir / "config.json").read_text())
    vocab = int(dense["vocab_size"])
    config = moe_config(shape, vocab, dense["eos_token_id"], dense["bos_token_id"])
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_weights(out_dir / "model.safetensors", moe_weights(shape, vocab))
    return out_dir


def moe_fingerprint() -> str:
    """Cache key: the family build's key and this module's source."""
    digest = hashlib.sha256(family_fingerprint(MOE_FAMILY).encode())
    digest.update(resources.files(__package__).joinpath("model.py").read_bytes())
    return digest.hexdigest()[:16]


def ensure_moe_model(cache_dir: Path | None = None) -> Path:
    """A cached build keyed by :func:`moe_fingerprint`, built if missing."""
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    target = root / f"tiny-qwen3-moe-{moe_fingerprint()}"
    return publish_cached(target, lambda out: build_moe_model(out))
