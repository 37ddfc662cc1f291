"""The chaos bench's agent: several Chat Completions calls with pauses, retried like an SDK.

Shipped into each sandbox as a file (stdlib only). Each turn extends the conversation with
the previous answer, so a whole rollout is one segment. A call that fails the way an SDK
retries (connection refused or reset, timeout, 408/409/429/5xx) is sent again unchanged with
`x-stainless-retry-count` set, as the official SDKs do, with capped exponential backoff: the
agent rides out a gateway or engine restart instead of dying. Any other error ends it.

Env: AGENT_TURNS (default 4), AGENT_SLEEP_S (pause before each call, default 0.5),
AGENT_MAX_RETRIES (default 12), AGENT_MAX_TOKENS (default 32), AGENT_HOLD_FILE (if set:
before its last call, wait until that file exists, so the conversation stays open for as
long as the run wants). Writes its last answer to answer.txt and each answer it received
to answers.jsonl.
"""

import json
import os
import random
import sys
import time
import urllib.error
import urllib.request

RETRY_STATUSES = {408, 409, 429}


def call(base: str, key: str, body: dict, max_retries: int) -> str:
    data = json.dumps(body).encode()
    for retry in range(max_retries + 1):
        headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
        if retry:
            headers["x-stainless-retry-count"] = str(retry)
        req = urllib.request.Request(base.rstrip("/") + "/chat/completions", data, headers)
        try:
            with urllib.request.urlopen(req, timeout=60) as reply:
                return json.load(reply)["choices"][0]["message"]["content"] or ""
        except urllib.error.HTTPError as exc:
            text = exc.read()[:300].decode(errors="replace")
            if (exc.code < 500 and exc.code not in RETRY_STATUSES) or retry == max_retries:
                print(f"giving up: HTTP {exc.code}: {text}", flush=True)
                raise
            print(f"retry {retry + 1} after HTTP {exc.code}: {text}", flush=True)
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            if retry == max_retries:
                print(f"giving up: {exc!r}", flush=True)
                raise
            print(f"retry {retry + 1} after {exc!r}", flush=True)
        time.sleep(min(0.5 * 2**retry, 8.0) * (0.75 + random.random() / 2))
    raise AssertionError("unreachable")


def main() -> None:
    base = os.environ["OPENAI_BASE_URL"]
    key = os.environ["OPENAI_API_KEY"]
    model = os.environ.get("ROLLOUT_MODEL", "policy")
    with open(os.environ["ROLLOUT_PROMPT_FILE"]) as f:
        prompt = f.read()
    turns = int(os.environ.get("AGENT_TURNS", "4"))
    pause = float(os.environ.get("AGENT_SLEEP_S", "0.5"))
    max_retries = int(os.environ.get("AGENT_MAX_RETRIES", "12"))
    max_tokens = int(os.environ.get("AGENT_MAX_TOKENS", "32"))
    hold = os.environ.get("AGENT_HOLD_FILE")
    messages = [
        {"role": "system", "content": "You are a careful agent. Answer briefly."},
        {"role": "user", "content": prompt},
    ]
    answer = ""
    with open("answers.jsonl", "a") as log:
        for turn in range(turns):
            if hold and turn == turns - 1 and not os.path.exists(hold):
                print(f"holding until {hold} exists", flush=True)
                while not os.path.exists(hold):
                    time.sleep(0.2)
            time.sleep(pause)
            body = {"model": model, "messages": messages, "max_tokens": max_tokens}
            answer = call(base, key, body, max_retries)
            log.write(json.dumps({"turn": turn, "answer": answer}) + "\n")
            log.flush()
            print(f"turn {turn}: {answer!r}", flush=True)
            messages.append({"role": "assistant", "content": answer})
            messages.append({"role": "user", "content": f"Check it and say it again ({turn})."})
    with open("answer.txt", "w") as f:
        f.write(answer + "\n")


if __name__ == "__main__":
    sys.exit(main())
