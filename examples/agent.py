"""A tiny multi-turn agent for the demo and tests: stdlib only, runs in any sandbox.

It reads its task from $ROLLOUT_PROMPT_FILE, talks to the Gateway session through the
OpenAI Chat Completions API ($OPENAI_BASE_URL, key $OPENAI_API_KEY), and writes its last
answer to answer.txt in the working directory — where the task's evaluation looks.
It is deliberately simple: the point is a real process making real HTTP calls from
inside the sandbox, recorded token-exactly by the Gateway.

Env: AGENT_TURNS (default 2), AGENT_MAX_TOKENS (default 48), AGENT_SLEEP_S (pause
before each call; lets tests kill a worker mid-run or exceed a budget).
"""

import json
import os
import time
import urllib.error
import urllib.request


def chat(base: str, key: str, model: str, messages: list, max_tokens: int) -> str:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens}
    req = urllib.request.Request(
        base.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"},
    )
    for attempt in range(3):
        try:
            with urllib.request.urlopen(req, timeout=120) as reply:
                return json.load(reply)["choices"][0]["message"]["content"] or ""
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or attempt == 2:
                raise
            time.sleep(1 + attempt)
    return ""


def main() -> None:
    base = os.environ["OPENAI_BASE_URL"]
    key = os.environ["OPENAI_API_KEY"]
    model = os.environ.get("ROLLOUT_MODEL", "policy")
    with open(os.environ["ROLLOUT_PROMPT_FILE"]) as f:
        prompt = f.read()
    turns = int(os.environ.get("AGENT_TURNS", "2"))
    max_tokens = int(os.environ.get("AGENT_MAX_TOKENS", "48"))
    pause = float(os.environ.get("AGENT_SLEEP_S", "0"))
    messages = [
        {"role": "system", "content": "You are a careful agent. Answer briefly."},
        {"role": "user", "content": prompt},
    ]
    answer = ""
    for turn in range(turns):
        if pause:
            time.sleep(pause)
        answer = chat(base, key, model, messages, max_tokens)
        print(f"turn {turn}: {answer!r}", flush=True)
        messages.append({"role": "assistant", "content": answer})
        messages.append({"role": "user", "content": "Check your answer and state it again."})
    with open("answer.txt", "w") as f:
        f.write(answer + "\n")


if __name__ == "__main__":
    main()
