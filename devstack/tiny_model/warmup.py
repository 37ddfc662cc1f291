"""Supervised warm-up of the tiny model on the task family (runs in the vLLM venv: torch).

``python -m devstack.tiny_model.warmup --base BASE --out OUT --recipe JSON`` trains a
fresh Qwen3-architecture model of the recipe's shape on conversations from
:mod:`tasks`, rendered with the model's own chat template and tokenized the way the
Gateway records them (each prompt part and each assistant reply encoded separately, then
concatenated), with the loss on assistant tokens only. BASE is a random tiny-model build:
its tokenizer, template and generation config are reused, so token IDs stay the same.
The main environment never imports this module (it has no torch); :mod:`warm` runs it.

Deterministic for a recipe: seeded data and init, a fixed thread count and
deterministic algorithms. The weights are written as float32 (tied embeddings, no
``lm_head``), which transformers and vLLM both load; serve with ``--dtype float32`` for
trainer/engine log-probability agreement.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import Qwen3Config, Qwen3ForCausalLM

from .tasks import TaskCase, conversation, heldout_cases, iter_cases
from .template import render_chat
from .warm import WarmupRecipe
from .weights import hf_config

COPIED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)


class Example(BaseModel):
    ids: list[int]
    mask: list[int]


def encode_conversation(tok: Tokenizer, case: TaskCase) -> Example:
    """Token IDs and loss mask of ``case``'s reference conversation.

    Every assistant turn is the text its prompt (rendered with the generation prompt)
    does not already hold, encoded on its own, as an engine would have sampled it; the
    ``\\n`` the template puts after ``<|im_end|>`` belongs to the next prompt.
    """
    messages, tools = conversation(case)
    ids: list[int] = []
    mask: list[int] = []
    done = ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = render_chat(messages[:i], tools, add_generation_prompt=True)
        full = render_chat(messages[: i + 1], tools)
        if not (prompt.startswith(done) and full.startswith(prompt)):
            raise ValueError(f"{case.task_id}: the template is not append-only here")
        reply = full[len(prompt) :].removesuffix("\n")
        part = tok.encode(prompt[len(done) :], add_special_tokens=False).ids
        out = tok.encode(reply, add_special_tokens=False).ids
        ids += part + out
        mask += [0] * len(part) + [1] * len(out)
        done = prompt + reply
    return Example(ids=ids, mask=mask)


def batches(tok: Tokenizer, recipe: WarmupRecipe) -> Iterator[tuple[list[Example], list[Example]]]:
    """(short examples, tool examples) per step, from cases outside the held-out set."""
    excluded = frozenset(c.key for c in heldout_cases(recipe.heldout_seed, recipe.heldout_excluded))
    cases = iter_cases(recipe.seed, "warmup", excluded)
    short: list[Example] = []
    tool: list[Example] = []
    for case in cases:
        example = encode_conversation(tok, case)
        bucket = tool if case.tools else short
        if len(bucket) < (recipe.batch_tool if case.tools else recipe.batch_short):
            bucket.append(example)
        if len(short) == recipe.batch_short and len(tool) == recipe.batch_tool:
            yield short, tool
            short, tool = [], []


def _tensors(examples: list[Example], pad_id: int) -> tuple[torch.Tensor, ...]:
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.float32)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        ids[row, : len(e.ids)] = torch.tensor(e.ids)
        mask[row, : len(e.mask)] = torch.tensor(e.mask, dtype=torch.float32)
        attn[row, : len(e.ids)] = 1
    return ids, mask, attn


def assistant_nll(
    model: Qwen3ForCausalLM, examples: list[Example], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sum of NLL, number of tokens, number right under argmax) over assistant tokens.

    The vocabulary projection runs only where a loss is taken: it is most of the cost
    of a small model on long prompts.
    """
    ids, mask, attn = _tensors(examples, pad_id)
    hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]
    where = mask[:, 1:].bool()
    logits = model.lm_head(hidden[where]).float()
    target = ids[:, 1:][where]
    nll = torch.nn.functional.cross_entropy(logits, target, reduction="sum")
    right = (logits.argmax(-1) == target).float().sum()
    return nll, torch.tensor(float(target.numel())), right


def build_model(base: Path, recipe: WarmupRecipe) -> tuple[Qwen3ForCausalLM, dict[str, Any]]:
    base_cfg = json.loads((base / "config.json").read_text())
    cfg = hf_config(
        recipe.shape, base_cfg["vocab_size"], base_cfg["eos_token_id"], base_cfg["bos_token_id"]
    )
    cfg["torch_dtype"] = "float32"
    torch.manual_seed(recipe.seed)
    model = Qwen3ForCausalLM(Qwen3Config(**cfg))
    return model.float(), cfg


def lr_at(step: int, recipe: WarmupRecipe) -> float:
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(base: Path, out: Path, recipe: WarmupRecipe, log_every: int = 10) -> dict[str, Any]:
    """Train and write the model directory ``out``; returns the training summary."""
    torch.set_num_threads(recipe.threads)
    torch.use_deterministic_algorithms(True)
    tok = Tokenizer.from_file(str(base / "tokenizer.json"))
    pad_id = json.loads((base / "generation_config.json").read_text())["pad_token_id"]
    model, cfg = build_model(base, recipe)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay}],
        lr=recipe.lr,
        betas=(0.9, 0.98),
        weight_decay=0.0,
    )
    model.train()
    started = time.monotonic()
    curve: list[dict[str, float]] = []
    for step, (short, tool) in enumerate(batches(tok, recipe)):
        if step == recipe.steps:
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, recipe)
        nll_a, n_a, right_a = assistant_nll(model, short, pad_id)
        nll_b, n_b, right_b = assistant_nll(model, tool, pad_id)
        loss = (nll_a + nll_b) / (n_a + n_b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % log_every == 0 or step == recipe.steps - 1:
            point = {
                "step": step,
                "loss": round(loss.item(), 4),
                "token_acc": round(((right_a + right_b) / (n_a + n_b)).item(), 4),
                "elapsed_s": round(time.monotonic() - started, 1),
            }
            curve.append(point)
            print(json.dumps(point), flush=True)
    write_model(model, cfg, base, out)
    summary = {"recipe": recipe.model_dump(), "curve": curve}
    summary["train_s"] = round(time.monotonic() - started, 1)
    (out / "warmup.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def write_model(model: Qwen3ForCausalLM, cfg: dict[str, Any], base: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().float().contiguous()
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for name in COPIED_FILES:
        shutil.copyfile(base / name, out / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.tiny_model.warmup")
    parser.add_argument("--base", type=Path, required=True, help="a random tiny-model build")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--recipe", default="{}", help="WarmupRecipe fields as JSON")
    args = parser.parse_args(argv)
    recipe = WarmupRecipe.model_validate_json(args.recipe)
    summary = train(args.base, args.out, recipe)
    print(json.dumps({"done": str(args.out), "train_s": summary["train_s"]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
