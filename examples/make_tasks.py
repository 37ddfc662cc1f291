"""Build the example tasks (examples/tasks.jsonl) around examples/agent.py.

Run `python examples/make_tasks.py` after changing the agent or the tasks; the JSONL is
committed so `rollout run examples/tasks.jsonl` and `rollout demo` need nothing else.
Each task ships the agent into the sandbox as a file, runs it with the `command`
harness, and checks answer.txt with the `evaluate` hook (reward 1 or 0).
"""

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
AGENT_PATH = "/home/agent/agent.py"

QUESTIONS = [
    ("arith-mul", "What is 6 times 7? Reply with the number only.", "42"),
    ("capital-fr", "What is the capital of France? Reply with one word.", "Paris"),
    ("hello-py", "Write the Python statement that prints hello. Reply with code only.", "print"),
    ("count-cjk", "把数字三写成阿拉伯数字。只回答数字。", "3"),
]


def task(
    task_id: str,
    prompt: str,
    expect: str,
    *,
    turns: int = 2,
    sleep_s: float = 0.0,
    budget_s: float = 120.0,
    backend: str = "local",
    **overrides: Any,
) -> dict[str, Any]:
    """One task as plain JSON (what a JSONL line holds)."""
    data: dict[str, Any] = {
        "task_id": task_id,
        "prompt": prompt,
        "harness": {
            "name": "command",
            "config": {
                "command": f"python3 {AGENT_PATH}",
                "env": {"AGENT_TURNS": str(turns), "AGENT_SLEEP_S": str(sleep_s)},
            },
            "budget_s": budget_s,
        },
        "sandbox": {
            "backend": backend,
            "files": [{"path": AGENT_PATH, "content": (HERE / "agent.py").read_text()}],
            "resources": {"cpus": 1.0, "memory_mb": 512, "pids": 256},
        },
        "evaluation": {"checks": [{"kind": "file", "path": "answer.txt", "contains": [expect]}]},
        "policy_version": "tiny-random-v0",
        "sampling": {"temperature": 1.0, "max_tokens": 48},
    }
    data.update(overrides)
    return data


def example_tasks() -> list[dict[str, Any]]:
    return [task(tid, prompt, expect) for tid, prompt, expect in QUESTIONS]


def main() -> None:
    out = HERE / "tasks.jsonl"
    out.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in example_tasks()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
