"""A seeded family of small verifiable tasks for the tiny model (warm-up, RL, held-out).

Four kinds: ``add`` (two-number sum), ``reverse`` (a word spelled backwards), ``count``
(characters in a Latin or CJK string) and ``weather`` (needs a ``get_weather`` tool call
and its result before the answer: multi-turn through :mod:`task_agent`). Every case has
one reference answer; the reward is the task's file check: ``answer.txt`` equals it.

The same seed gives the same cases. The held-out split is generated first and its cases
(prompt, plus the tool's data for weather) are excluded from the training split and from
the warm-up's conversations, so held-out reward measures generalisation, not recall.
Imports nothing outside this package (it runs in the vLLM venv during the warm-up too);
callers that need ``RolloutTask`` validate the dicts :func:`rollout_task` returns.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from . import task_agent
from .corpus import CITIES_EN, CJK_CHARS, CJK_WORDS, NOUNS

FAMILY = "tiny-tasks-v1"
KINDS: tuple[str, ...] = ("add", "reverse", "count", "weather")
AGENT_PATH = "/home/agent/task_agent.py"
WEATHER_PATH = f"/home/agent/{task_agent.WEATHER_FILE}"
ANSWER_FILE = "answer.txt"
MAX_TOKENS = 48
"""Per model call: enough for a tool call (~25 tokens) or any reference answer."""

Split = Literal["train", "heldout"]
HELDOUT_SEED = 0
HELDOUT_SIZE = 64
"""The canonical held-out split: the first 64 cases of seed 0 (16 per kind). The warm-up
never trains on their prompts; use ``heldout_cases(HELDOUT_SEED, n <= 64)``."""

WORDS = tuple(w for w in NOUNS if w.isalpha() and w.islower() and 3 <= len(w) <= 6)
CJK_CITIES = tuple(CJK_WORDS[1:10])
CITIES = (*CITIES_EN[8:12], *CJK_CITIES[:4])
"""Eight cities (four CJK) and ten temperatures: few enough that the warm-up can learn
to carry each from the prompt into the call and from the tool's reply into the answer."""
TEMPERATURES = (15, 24)
SKIES = ("sunny", "cloudy", "rainy", "windy")
ADD_MAX = 9
"""Single-digit addends: 100 sums a tiny model can learn as a table and generalise from."""


class TaskCase(BaseModel):
    """One task: what the user asks, the only accepted answer, and the tool's data."""

    task_id: str
    kind: str
    prompt: str
    answer: str
    tools: list[str] = []
    city: str | None = None
    weather: dict[str, dict[str, Any]] = {}

    @property
    def key(self) -> str:
        """What makes two cases the same task: the prompt, plus the tool's data."""
        return self.prompt + (json.dumps(self.weather, sort_keys=True) if self.weather else "")


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, ADD_MAX), rng.randint(0, ADD_MAX)
    return f"What is {a} + {b}? Reply with the number only.", str(a + b)


def _reverse(rng: random.Random) -> tuple[str, str]:
    word = rng.choice(WORDS)
    return f"Reverse the word {word}. Reply with the reversed word only.", word[::-1]


def _count(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:
        pieces: list[str] = []
        while sum(map(len, pieces)) < rng.randint(1, 7):
            pieces.append(rng.choice(CJK_WORDS) if rng.random() < 0.5 else rng.choice(CJK_CHARS))
        text = "".join(pieces)[:8]
    else:
        text = rng.choice(WORDS)
    return f"How many characters are in {text}? Reply with the number only.", str(len(text))


def _weather(rng: random.Random) -> tuple[str, str, str, dict[str, dict[str, Any]]]:
    cities = rng.sample(CITIES, 3)
    # A string value: its digits are then the same token as in the answer (` 23` is not).
    table = {
        c: {"temperature": str(rng.randint(*TEMPERATURES)), "sky": rng.choice(SKIES)}
        for c in cities
    }
    city = cities[0]
    # Quoted, the city is the same token in the prompt as in the tool call's JSON.
    prompt = f'What is the temperature in "{city}" now? Use the tool, then reply with the number.'

    return prompt, str(table[city]["temperature"]), city, dict(sorted(table.items()))


def make_case(rng: random.Random, kind: str, task_id: str) -> TaskCase:
    if kind == "weather":
        prompt, answer, city, table = _weather(rng)
        return TaskCase(
            task_id=task_id,
            kind=kind,
            prompt=prompt,
            answer=answer,
            tools=["get_weather"],
            city=city,
            weather=table,
        )
    gen = {"add": _add, "reverse": _reverse, "count": _count}[kind]
    prompt, answer = gen(rng)
    return TaskCase(task_id=task_id, kind=kind, prompt=prompt, answer=answer)


def iter_cases(
    seed: int, split: str, exclude: frozenset[str] = frozenset(), unique: bool = False
) -> Iterator[TaskCase]:
    """Endless cases, kinds in turn; a case whose ``key`` is in ``exclude`` (or, with
    ``unique``, was given already) is drawn again, so the kinds stay balanced."""
    rng = random.Random(f"{FAMILY}:{seed}:{split}")
    seen = set(exclude)
    index = 0
    misses = 0
    while True:
        kind = KINDS[index % len(KINDS)]
        case = make_case(rng, kind, f"{split}-{index:05d}-{kind}")
        if case.key in seen:
            misses += 1
            if misses > 100_000:
                raise ValueError(f"no more distinct {kind} tasks (reverse has {len(WORDS)} words)")
            continue
        if unique:
            seen.add(case.key)
        misses = 0
        yield case
        index += 1


def heldout_cases(seed: int, n: int) -> list[TaskCase]:
    """``n`` distinct held-out cases (balanced kinds)."""
    return list(itertools.islice(iter_cases(seed, "heldout", unique=True), n))


def train_cases(seed: int, n: int, heldout: list[TaskCase]) -> list[TaskCase]:
    """``n`` distinct training cases, none of them a held-out case."""
    excluded = frozenset(c.key for c in heldout)
    return list(itertools.islice(iter_cases(seed, "train", excluded, unique=True), n))


def wrong_answer(case: TaskCase) -> str:
    """A near miss the check must reject (for tests)."""
    if case.answer.lstrip("-").isdigit():
        return str(int(case.answer) + 1)
    return case.answer + case.answer[-1]


VERBOSE_ANSWER = "The answer is {answer}."
"""The chatty style the warm-up mixes in: right content, but the file check wants the bare
answer, so the warmed-up model starts with a format habit that RL can unlearn."""


def conversation(
    case: TaskCase, verbose: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) the agent and a model produce for ``case``: a perfect one, or
    with ``verbose`` one whose final answer is wrapped in :data:`VERBOSE_ANSWER`."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": task_agent.SYSTEM_PROMPT},
        {"role": "user", "content": case.prompt},
    ]
    tools = [task_agent.TOOLS_BY_NAME[n] for n in case.tools] or None
    if case.kind == "weather":
        arguments = json.dumps({"city": case.city}, ensure_ascii=False)
        call = {"id": "call_0", "type": "function"}
        call["function"] = {"name": "get_weather", "arguments": arguments}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        result = task_agent.weather_reply(case.weather, arguments)
        messages.append({"role": "tool", "tool_call_id": "call_0", "content": result})
    answer = VERBOSE_ANSWER.format(answer=case.answer) if verbose else case.answer
    messages.append({"role": "assistant", "content": answer})
    return messages, tools


def agent_source() -> str:
    return resources.files(__package__).joinpath("task_agent.py").read_text("utf-8")


def rollout_task(
    case: TaskCase,
    *,
    policy_version: str = "tiny-warm-v0",
    backend: str = "local",
    budget_s: float = 120.0,
) -> dict[str, Any]:
    """``case`` as a ``RolloutTask`` JSON object (one JSONL line)."""
    files = [{"path": AGENT_PATH, "content": agent_source()}]
    env = {"AGENT_MAX_TOKENS": str(MAX_TOKENS)}
    if case.tools:
        env["TASK_TOOLS"] = ",".join(case.tools)
        files.append({"path": WEATHER_PATH, "content": json.dumps(case.weather) + "\n"})
    return {
        "task_id": case.task_id,
        "prompt": case.prompt,
        "harness": {
            "name": "command",
            "config": {"command": f"python3 {AGENT_PATH}", "env": env},
            "budget_s": budget_s,
        },
        "sandbox": {
            "backend": backend,
            "files": files,
            "resources": {"cpus": 1.0, "memory_mb": 512, "pids": 256},
        },
        "evaluation": {"checks": [{"kind": "file", "path": ANSWER_FILE, "equals": case.answer}]},
        "policy_version": policy_version,
        "sampling": {"temperature": 1.0, "max_tokens": MAX_TOKENS},
        "metadata": {"family": FAMILY, "kind": case.kind},
    }


def score(case: TaskCase, answer: str) -> float:
    """The file check's rule for an agent that wrote ``answer`` (stripped) + newline."""
    return 1.0 if (answer.strip() + "\n").rstrip() == case.answer.rstrip() else 0.0


def write_task_files(
    out_dir: Path, *, seed: int = 0, n_train: int = 64, n_heldout: int = 64, **task_kwargs: Any
) -> tuple[Path, Path]:
    """Write ``train.jsonl`` and ``heldout.jsonl`` into ``out_dir``; returns both paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    heldout = heldout_cases(seed, n_heldout)
    paths = []
    for name, cases in (("train", train_cases(seed, n_train, heldout)), ("heldout", heldout)):
        path = out_dir / f"{name}.jsonl"
        lines = [json.dumps(rollout_task(c, **task_kwargs), ensure_ascii=False) for c in cases]
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def main(argv: list[str] | None = None) -> int:
    """``python -m devstack.tiny_model.tasks OUT_DIR``: write train.jsonl and heldout.jsonl."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m devstack.tiny_model.tasks")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=HELDOUT_SEED)
    parser.add_argument("--train", type=int, default=64)
    parser.add_argument("--heldout", type=int, default=HELDOUT_SIZE)
    parser.add_argument("--backend", default="local")
    args = parser.parse_args(argv)
    paths = write_task_files(
        args.out_dir,
        seed=args.seed,
        n_train=args.train,
        n_heldout=args.heldout,
        backend=args.backend,
    )
    print(*paths)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
