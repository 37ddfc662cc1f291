"""Screenshots of the viewer's Batch, Rollout and Evaluation pages for the docs
(docs/images/viewer-*.png), taken by headless Chromium over a made-up batch
(devstack.sample_batch: real sample rows, the tiny model's tokenizer for the text).

Run from the repository root: `.venv/bin/python scripts/viewer_screenshots.py [OUT_DIR]`.
"""

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

REASON = "/bin/sh: 1: python: not found"
DIFF = (
    "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
    " def mul(a, b):\n-    return a + b\n+    return a * b\n"
)


def turns(tok: Tokenizer) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    prompt = ids(
        "<|im_start|>system\nYou are a coding agent. Use the bash tool.<|im_end|>\n"
        "<|im_start|>user\nFix mul() in calc.py so the tests pass.<|im_end|>\n"
    )
    calls = [
        ("I will read the file first.\n<tool_call>cat calc.py</tool_call>",
         "def mul(a, b):\n    return a + b\n"),
        ("mul adds instead of multiplying.\n<tool_call>sed -i 's/a + b/a * b/' calc.py</tool_call>",
         "(no output)"),
        ("<tool_call>python -m pytest -q</tool_call>", "3 passed in 0.02s"),
        ("Fixed: mul() now multiplies.", ""),
    ]  # fmt: skip
    out = []
    for said, back in calls:
        after = f"<|im_start|>tool\n{back}<|im_end|>\n" if back else ""
        out.append((ids(f"<|im_start|>assistant\n{said}<|im_end|>\n"), ids(after)))
    return prompt, out


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
            batch_id=out.name, seed=i,
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
