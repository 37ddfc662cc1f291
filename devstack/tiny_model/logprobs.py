"""Log-probabilities of sampled tokens under transformers, float32 (runs in the vLLM venv).

``python -m devstack.tiny_model.logprobs MODEL_DIR IN.json OUT.json``: IN holds a list of
``{"prompt_ids": [...], "response_ids": [...]}``; OUT gets, per item, the float32
log-probability of every response token given everything before it. Used to measure
trainer/engine agreement against the engine's own ``logprobs`` for the same tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def sequence_logprobs(
    model: torch.nn.Module, prompt: list[int], response: list[int]
) -> list[float]:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    picked = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(response)[:, None])
    return picked[:, 0].tolist()


def main(argv: list[str] | None = None) -> int:
    model_dir, src, dst = (argv or sys.argv[1:])[:3]
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    items = json.loads(Path(src).read_text())
    out = [sequence_logprobs(model, it["prompt_ids"], it["response_ids"]) for it in items]
    Path(dst).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
