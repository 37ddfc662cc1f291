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
import random
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
from .warm import WarmupRecipe, style_evaluates, style_stop
from .weights import hf_config

COPIED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)


class Example(BaseModel):
    """A tokenized reference conversation: ``mask`` marks assistant tokens, ``key`` the
    ones that carry the task (the answer, the tool call's argument)."""

    kind: str = ""
    ids: list[int]
    mask: list[int]
    key: list[int] = []


def _key_span(case: TaskCase, reply: str) -> tuple[int, int]:
    """Where in an assistant ``reply`` the task's own content is (the rest is format)."""
    value = case.answer if "<tool_call>" not in reply else (case.city or "")
    start = reply.rfind(value) if value else -1
    return (start, start + len(value)) if start >= 0 else (0, 0)


def encode_conversation(tok: Tokenizer, case: TaskCase, verbose: bool = False) -> Example:
    """Token IDs and loss mask of ``case``'s reference conversation.

    Every assistant turn is the text its prompt (rendered with the generation prompt)
    does not already hold, encoded on its own, as an engine would have sampled it; the
    ``\\n`` the template puts after ``<|im_end|>`` belongs to the next prompt.
    """
    messages, tools = conversation(case, verbose)
    ids: list[int] = []
    mask: list[int] = []
    key: list[int] = []
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
        encoded = tok.encode(reply, add_special_tokens=False)
        lo, hi = _key_span(case, reply)
        ids += part + encoded.ids
        mask += [0] * len(part) + [1] * len(encoded.ids)
        key += [0] * len(part) + [int(a < hi and b > lo) for a, b in encoded.offsets]
        done = prompt + reply
    return Example(kind=case.kind, ids=ids, mask=mask, key=key)


def batches(tok: Tokenizer, recipe: WarmupRecipe) -> Iterator[tuple[list[Example], list[Example]]]:
    """(short examples, tool examples) per step, from cases outside the held-out set; in
    the style phase (after ``recipe.steps``) a seeded ``recipe.verbose_fraction`` of them
    end in the verbose answer style."""
    excluded = frozenset(c.key for c in heldout_cases(recipe.heldout_seed, recipe.heldout_excluded))
    cases = iter_cases(recipe.seed, "warmup", excluded)
    style = random.Random(f"style:{recipe.seed}")
    short: list[Example] = []
    tool: list[Example] = []
    step = 0
    for case in cases:
        verbose = step >= recipe.steps and style.random() < recipe.verbose_fraction
        example = encode_conversation(tok, case, verbose)
        bucket = tool if case.tools else short
        if len(bucket) < (recipe.batch_tool if case.tools else recipe.batch_short):
            bucket.append(example)
        if len(short) == recipe.batch_short and len(tool) == recipe.batch_tool:
            yield short, tool
            short, tool = [], []
            step += 1


def _tensors(
    examples: list[Example], pad_id: int, key_weight: float = 1.0
) -> tuple[torch.Tensor, ...]:
    """(ids, loss weight per token, attention mask): weight 1 on format tokens of the
    assistant turns, ``key_weight`` on their key tokens, 0 elsewhere."""
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    weight = torch.zeros((len(examples), width), dtype=torch.float32)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        ids[row, : len(e.ids)] = torch.tensor(e.ids)
        mask = torch.tensor(e.mask, dtype=torch.float32)
        if e.key:
            mask += (key_weight - 1.0) * torch.tensor(e.key, dtype=torch.float32)
        weight[row, : len(e.mask)] = mask
        attn[row, : len(e.ids)] = 1
    return ids, weight, attn


def _common_prefix(ids: torch.Tensor, attn: torch.Tensor) -> int:
    """How many leading tokens every row shares (at least one token left per row)."""
    same = (ids == ids[:1]).all(0) & attn.bool().all(0)
    differs = (~same).nonzero()
    shared = int(differs[0]) if len(differs) else ids.shape[1]
    return min(shared, int(attn.sum(1).min()) - 1)


def _hidden_states(model: Qwen3ForCausalLM, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """Last hidden states of a batch, computing the rows' shared prefix once.

    Every tool conversation starts with the same few hundred tokens of tool
    instructions; running them once and letting the rows attend to its keys and values
    gives the same result as the full batch (causal attention) in a fraction of the time.
    """
    shared = _common_prefix(ids, attn)
    if len(ids) < 2 or shared < 64:
        return model.model(input_ids=ids, attention_mask=attn).last_hidden_state
    head = model.model(input_ids=ids[:1, :shared], use_cache=True)
    cache = head.past_key_values
    for layer in cache.layers:
        layer.keys = layer.keys.expand(len(ids), -1, -1, -1)
        layer.values = layer.values.expand(len(ids), -1, -1, -1)
    tail = model.model(
        input_ids=ids[:, shared:], attention_mask=attn, past_key_values=cache, use_cache=True
    )
    prefix = head.last_hidden_state.expand(len(ids), -1, -1)
    return torch.cat([prefix, tail.last_hidden_state], dim=1)


def _target_logprobs(
    model: Qwen3ForCausalLM, examples: list[Example], pad_id: int, key_weight: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log-prob, weight, argmax-right, row) of every assistant token of ``examples``.

    The vocabulary projection runs only where a loss is taken: it is most of the cost
    of a small model on long prompts.
    """
    ids, weight, attn = _tensors(examples, pad_id, key_weight)
    hidden = _hidden_states(model, ids, attn)[:, :-1]
    where = weight[:, 1:] > 0
    logits = model.lm_head(hidden[where]).float()
    target = ids[:, 1:][where]
    logp = torch.log_softmax(logits, -1).gather(1, target[:, None])[:, 0]
    right = (logits.argmax(-1) == target).float()
    rows = torch.arange(len(examples))[:, None].expand_as(where)[where]
    return logp, weight[:, 1:][where], right, rows


def assistant_nll(
    model: Qwen3ForCausalLM, examples: list[Example], pad_id: int, key_weight: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, float, int]:
    """(weighted sum of NLL, sum of weights, number right under argmax, number of
    tokens) over assistant tokens. The weights let the few tokens that carry the task
    count against the format around them, which the model otherwise learns alone."""
    logp, weight, right, _ = _target_logprobs(model, examples, pad_id, key_weight)
    return -(logp * weight).sum(), weight.sum(), right.sum().item(), right.numel()


@torch.no_grad()
def expected_reward(
    model: Qwen3ForCausalLM, examples: list[Example], pad_id: int
) -> dict[str, float]:
    """Mean probability, per kind, that sampling at temperature 1 reproduces the
    reference conversation's assistant turns: a lower bound of the held-out reward
    (other token paths to the same answer also score) that needs no engine."""
    was_training = model.training
    model.eval()
    by_kind: dict[str, list[float]] = {}
    for e in examples:
        logp, _, _, _ = _target_logprobs(model, [e], pad_id)
        by_kind.setdefault(e.kind, []).append(math.exp(logp.sum().item()))
    model.train(was_training)
    means = {k: sum(v) / len(v) for k, v in sorted(by_kind.items())}
    means["mean"] = sum(sum(v) for v in by_kind.values()) / len(examples)
    return means


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
    """Linear warm-up, cosine decay to a tenth over ``steps``; constant in the style phase."""
    if step >= recipe.steps:
        return recipe.style_lr
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    base: Path, out: Path, recipe: WarmupRecipe, log_every: int = 10, eval_every: int = 50
) -> dict[str, Any]:
    """Train and write the model directory ``out``; returns the training summary.

    Every ``eval_every`` steps of the skills phase, every ``recipe.style_eval_every`` of
    the style phase and at the end, the curve gets the held-out cases'
    :func:`expected_reward` per kind. The style phase ends by :func:`style_stop`; the
    summary's ``stop`` says at which step, why, and the reward there (the curve's last
    point is that step).
    """
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
    heldout = [
        encode_conversation(tok, c)
        for c in heldout_cases(recipe.heldout_seed, recipe.heldout_excluded)
    ]
    model.train()
    started = time.monotonic()
    curve: list[dict[str, Any]] = []
    stop: dict[str, Any] = {}
    total = recipe.steps + recipe.style_steps
    for step, (short, tool) in enumerate(batches(tok, recipe)):
        if step == total:
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, recipe)
        nll_a, w_a, right_a, n_a = assistant_nll(model, short, pad_id, recipe.key_weight)
        nll_b, w_b, right_b, n_b = assistant_nll(model, tool, pad_id, recipe.key_weight)
        loss = (nll_a + nll_b) / (w_a + w_b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        evaluate = step % eval_every == 0 if step < recipe.steps else style_evaluates(step, recipe)
        evaluate = evaluate or step == total - 1
        reward = expected_reward(model, heldout, pad_id) if evaluate else None
        mean = round(reward["mean"], 4) if reward else None
        reason = style_stop(step, mean, recipe) or ("step_cap" if step == total - 1 else None)
        if step % log_every == 0 or reward is not None or reason:
            point: dict[str, Any] = {
                "step": step,
                "loss": round(loss.item(), 4),
                "token_acc": round((right_a + right_b) / (n_a + n_b), 4),
                "elapsed_s": round(time.monotonic() - started, 1),
            }
            if reward is not None:
                point["heldout_expected_reward"] = {k: round(v, 4) for k, v in reward.items()}
            curve.append(point)
            print(json.dumps(point), flush=True)
        if reason:
            stop = {"step": step, "reason": reason, "heldout_expected_reward": mean}
            break
    write_model(model, cfg, base, out)
    summary = {"recipe": recipe.model_dump(), "stop": stop, "curve": curve}
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
