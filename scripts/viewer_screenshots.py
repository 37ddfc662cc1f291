"""Screenshots of the viewer's Batch, Rollout (tokens, conversation) and Evaluation
pages for the docs (docs/images/viewer-*.png), taken by headless Chromium over a made-up batch
(devstack.sample_batch: real sample rows, the tiny model's tokenizer for the text).

Run from the repository root: `.venv/bin/python scripts/viewer_screenshots.py [OUT_DIR]`.
"""

import json
import sys
import tempfile
from pathlib import Path

from tokenizers import Tokenizer

from devstack.browser import headless_chromium, rollout_view
from devstack.sample_batch import (
    eval_error,
    passed_evaluation,
    result,
    rollout_rows,
    write_artifacts,
    write_manifest,
    write_rollout,
)
from devstack.tiny_model import ensure_tiny_model
from schemas.conversation import CallConversation, ConvMessage, ConvToolCall

REASON = "/bin/sh: 1: python: not found"
DIFF = (
    "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
    " def mul(a, b):\n-    return a + b\n+    return a * b\n"
)


SYSTEM = "You are a coding agent. Use the bash tool."
TASK = "Fix mul() in calc.py so the tests pass."
#: Each call: what the agent thought, said, the command it ran, and what came back.
CALLS = [
    ("The tests fail on mul.", "I will read the file first.", "cat calc.py",
     "def mul(a, b):\n    return a + b\n"),
    ("It adds.", "mul adds instead of multiplying.", "sed -i 's/a + b/a * b/' calc.py",
     "(no output)"),
    ("Check it.", "", "python -m pytest -q", "3 passed in 0.02s"),
    ("Done.", "Fixed: mul() now multiplies.", None, ""),
]  # fmt: skip


def turns(tok: Tokenizer) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    """The calls' tokens as the chat template renders them."""

    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    prompt = ids(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{TASK}<|im_end|>\n")
    out = []
    for thought, said, command, back in CALLS:
        call = f"\n<tool_call>{command}</tool_call>" if command else ""
        sampled = f"<|im_start|>assistant\n<think>{thought}</think>{said}{call}<|im_end|>\n"
        after = f"<|im_start|>tool\n{back}<|im_end|>\n" if back else ""
        out.append((ids(sampled), ids(after)))
    return prompt, out


def conversation() -> list[CallConversation | None]:
    """The same calls as their protocol carried them."""
    made: list[CallConversation | None] = []
    for i, (thought, said, command, _) in enumerate(CALLS):
        if i == 0:
            new = [
                ConvMessage(role="system", content=SYSTEM),
                ConvMessage(role="user", content=TASK),
            ]
        else:
            back = CALLS[i - 1][3]
            new = [ConvMessage(role="tool", content=back, tool_call_id=f"call-{i - 1}")]
        args = json.dumps({"command": command})
        calls = [ConvToolCall(name="bash", arguments=args, id=f"call-{i}")] if command else []
        reply = ConvMessage(
            role="assistant", reasoning=thought, content=said or None, tool_calls=calls
        )
        made.append(
            CallConversation(
                history=0 if i == 0 else 2 * i + 1,
                messages=new,
                tools=["bash"],
                reply=reply,
                finish_reason="stop",
            )
        )
    return made


def make(root: Path, tok: Tokenizer) -> tuple[Path, Path]:
    out, data = root / "b20261207-demo", root / "worker"
    out.mkdir()
    prompt, calls = turns(tok)
    results = []
    for i in range(12):
        task = ["calc-mul", "calc-div", "parse-csv"][i % 3]
        rid = f"b20261207-demo-{task}-{i // 3}"
        reward = [1.0, 0.0, 1.0, 0.5][i % 4]
        status, rollout_status, evaluation, reason = "ok", "ok", passed_evaluation(), ""
        if i == 5:
            status, rollout_status, reward = "infra_error", "eval_error", 0.0
            evaluation, reason = eval_error(REASON), f"check 'tests' could not run: {REASON}"
        rows = rollout_rows(
            rid, task, reward=reward, status=status, rollout_status=rollout_status,
            status_reason=reason, evaluation=evaluation, prompt_ids=prompt, turns=calls,
            batch_id=out.name, seed=i, conversation=conversation(),
        )  # fmt: skip
        write_rollout(out, rows)
        write_artifacts(data, rid, evaluation, DIFF, "agent: 4 calls, 3 tool runs\n")
        results.append(
            result(rid, task, rollout_status, None if i == 5 else reward, duration_s=20.0 + i)
        )
    write_manifest(out, out.name, results)
    return out, data


def main() -> None:
    dest = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images")
    dest.mkdir(parents=True, exist_ok=True)
    model = ensure_tiny_model()
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    with tempfile.TemporaryDirectory(prefix="viewer-shots-") as tmp:
        out, data = make(Path(tmp), tok)
        args = (str(out), "--artifacts", str(data), "--tokenizer", str(model))
        with rollout_view(*args) as url, headless_chromium(1280, 900) as driver:
            shots = {
                "viewer-batch.png": url,
                "viewer-rollout.png": f"{url}rollout/{out.name}-calc-mul-0",
                "viewer-conversation.png": f"{url}rollout/{out.name}-calc-mul-0?view=conversation",
                "viewer-evaluation.png": f"{url}rollout/{out.name}-parse-csv-1/evaluation",
            }
            for name, page in shots.items():
                driver.get(page)
                height = driver.execute_script("return document.body.scrollHeight")
                driver.set_window_size(1280, min(max(height + 40, 600), 1600))
                driver.save_screenshot(str(dest / name))
                print(dest / name)


if __name__ == "__main__":
    main()
