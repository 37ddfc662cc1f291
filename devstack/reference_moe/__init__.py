"""A STAND-IN MoE engine for checking routing replay without a GPU.

vLLM returns each token's routed experts (``--enable-return-routed-experts``) only with
its GPU model runner, so on CPU nothing real can produce them. This package gives the
next best thing, labelled as a stand-in everywhere it is used:

* ``model``: a tiny random Qwen3-MoE checkpoint (float32, a few experts, top-k 2), built
  deterministically with numpy and cached; it carries the ``qwen3`` tiny family's
  tokenizer and chat template, so the Gateway renders it as a shipped family.
* ``engine_server.py``: a server that samples with that model in transformers and answers
  vLLM's token-in/token-out ``/inference/v1/generate`` in vLLM's own protocol models,
  ``routed_experts`` included (the routing its forward passes actually used). It runs in
  the vLLM CPU venv (torch, transformers, vLLM) as a subprocess: ``server``.
* ``recompute_routing.py``: an independent check: a fresh model load and one plain
  forward per stored sequence, whose router logits must pick the stored experts.
  ``routing_check`` runs it from the main environment.

Main-environment modules here need numpy only (never torch).
"""

from .model import MOE_FAMILY, MoeShape, build_moe_model, ensure_moe_model, moe_fingerprint
from .routing_check import Agreement, RoutedSequence, RoutingReport, recompute_routing
from .server import ReferenceMoeServer

__all__ = [
    "MOE_FAMILY",
    "Agreement",
    "MoeShape",
    "ReferenceMoeServer",
    "RoutedSequence",
    "RoutingReport",
    "build_moe_model",
    "ensure_moe_model",
    "moe_fingerprint",
    "recompute_routing",
]
