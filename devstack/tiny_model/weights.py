"""Tiny randomly initialised Qwen3-architecture weights, written with numpy only.

The main environment must not need torch, so the tensors are drawn with a seeded numpy
generator and saved through ``safetensors.numpy``. Values are rounded to bfloat16
precision but stored as float32: vLLM (``--dtype bfloat16``) then casts them losslessly,
and the file stays readable by every safetensors version (numpy has no bf16 dtype).
head_dim is 64 because vLLM's CPU attention rejects smaller heads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel
from safetensors.numpy import save_file

WEIGHTS_SEED = 1234
INIT_STD = 0.02


class TinyQwen3Shape(BaseModel):
    """Architecture sizes; defaults keep the model at about one million parameters."""

    hidden_size: int = 128
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64
    num_hidden_layers: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 32768
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6


def hf_config(
    shape: TinyQwen3Shape, vocab_size: int, eos_token_id: int, bos_token_id: int | None
) -> dict[str, Any]:
    """The ``config.json`` transformers/vLLM read to pick Qwen3ForCausalLM."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": shape.num_hidden_layers,
        "initializer_range": INIT_STD,
        "tie_word_embeddings": True,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
    }


def _round_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 value (ties to even), kept as float32."""
    bits = x.astype(np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(
        0xFFFF0000
    )
    return rounded.view(np.float32)


def init_weights(
    shape: TinyQwen3Shape, vocab_size: int, seed: int = WEIGHTS_SEED
) -> dict[str, np.ndarray]:
    """Qwen3 parameter names and shapes; normals with std 0.02, norms at one."""
    rng = np.random.default_rng(seed)
    h, d = shape.hidden_size, shape.head_dim
    q_out, kv_out = shape.num_attention_heads * d, shape.num_key_value_heads * d

    def normal(*dims: int) -> np.ndarray:
        return _round_to_bf16(rng.standard_normal(dims, dtype=np.float32) * INIT_STD)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(vocab_size, h)}
    for i in range(shape.num_hidden_layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = ones(h)
        tensors[p + "post_attention_layernorm.weight"] = ones(h)
        tensors[p + "self_attn.q_proj.weight"] = normal(q_out, h)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv_out, h)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv_out, h)
        tensors[p + "self_attn.o_proj.weight"] = normal(h, q_out)
        tensors[p + "self_attn.q_norm.weight"] = ones(d)
        tensors[p + "self_attn.k_norm.weight"] = ones(d)
        tensors[p + "mlp.gate_proj.weight"] = normal(shape.intermediate_size, h)
        tensors[p + "mlp.up_proj.weight"] = normal(shape.intermediate_size, h)
        tensors[p + "mlp.down_proj.weight"] = normal(h, shape.intermediate_size)
    tensors["model.norm.weight"] = ones(h)
    return tensors


def write_weights(path: Path, tensors: dict[str, np.ndarray]) -> None:
    save_file(tensors, str(path), metadata={"format": "pt"})
