"""Independent recomputation of MoE routing with transformers (runs in the vLLM CPU venv).

Shares no code with the engine that recorded the routing: a fresh model load, then for
each stored sequence one plain forward over its whole token list (no KV cache) asking
transformers for the router logits (``output_router_logits``), and each token's top-k
experts taken from those logits. Reads a JSON request on stdin, writes the report on
stdout (see ``routing_check``, which runs it from the main environment).

A tie is a (token, layer) whose k-th and (k+1)-th largest router logits are equal to
float32 round-off between two forward paths (within ``TIE_TOLERANCE``; a request may set
a wider ``tie_tolerance`` for a bfloat16 engine): either expert is a correct k-th choice,
so it is counted apart and not compared. The request may also set ``dtype`` and
``device_map`` (a large model on a GPU).
"""

from __future__ import annotations

import base64
import io
import json
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

TIE_TOLERANCE = 1e-5
MISMATCHES_SHOWN = 20


def stored_rows(encoded: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(encoded)), allow_pickle=False)


def main() -> None:
    request = json.load(sys.stdin)
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(
        request["model_dir"],
        dtype=getattr(torch, request.get("dtype", "float32")),
        device_map=request.get("device_map"),
    )
    model.eval()
    tolerance = float(request.get("tie_tolerance", TIE_TOLERANCE))
    k = int(model.config.num_experts_per_tok)
    counts: dict[str, list[dict[str, int]]] = {}
    mismatches: list[dict[str, object]] = []
    for sequence in request["sequences"]:
        rows = stored_rows(sequence["routed_experts"])
        first = int(sequence["first_token"])
        ids = sequence["token_ids"][: first + rows.shape[0]]
        with torch.no_grad():
            out = model(
                input_ids=torch.tensor([ids], device=model.device),
                output_router_logits=True,
                use_cache=False,
            )
        layers = len(out.router_logits)
        if rows.ndim != 3 or rows.shape[1:] != (layers, k) or len(ids) != first + rows.shape[0]:
            raise SystemExit(
                f"{sequence['name']}: stored routing {rows.shape} does not fit "
                f"{len(sequence['token_ids'])} tokens from {first}, {layers} MoE layers, top-{k}"
            )
        mine = counts[sequence["name"]] = [
            {"agree": 0, "compared": 0, "ties": 0} for _ in range(layers)
        ]
        for layer, logits in enumerate(out.router_logits):
            logits = logits.reshape(len(ids), -1)[first:].float().cpu()
            top = torch.topk(logits, k + 1, dim=-1)
            tied = (top.values[:, k - 1] - top.values[:, k]).abs() <= tolerance
            for row in range(rows.shape[0]):
                if bool(tied[row]):
                    mine[layer]["ties"] += 1
                    continue
                mine[layer]["compared"] += 1
                picked = sorted(int(e) for e in top.indices[row, :k])
                stored = sorted(int(e) for e in rows[row, layer])
                if picked == stored:
                    mine[layer]["agree"] += 1
                elif len(mismatches) < MISMATCHES_SHOWN:
                    mismatches.append(
                        {
                            "sequence": sequence["name"],
                            "token": first + row,
                            "layer": layer,
                            "stored": stored,
                            "recomputed": picked,
                        }
                    )
    json.dump({"sequences": counts, "mismatches": mismatches}, sys.stdout)


if __name__ == "__main__":
    main()
