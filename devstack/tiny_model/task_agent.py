"""The agent that runs the tiny task family (``tasks.py``) inside a sandbox: stdlib only.

It reads its task from ``$ROLLOUT_PROMPT_FILE`` and talks to the Gateway session through
the OpenAI Chat Completions API (``$OPENAI_BASE_URL``, key ``$OPENAI_API_KEY``). With
``TASK_TOOLS=get_weather`` it offers the weather tool and answers the model's tool calls
from ``weather.json`` next to this file, for up to ``AGENT_MAX_TURNS`` model calls. The
last reply's content goes to ``answer.txt`` in the working directory, where the task's
file check looks.

The warm-up builds its training conversations from the same constants and tool function
(:data:`SYSTEM_PROMPT`, :data:`WEATHER_TOOL`, :func:`weather_reply`), so what the model
learns is exactly what this agent sends.
"""

import json
import os
import time
import urllib.error
import urllib.request

SYSTEM_PROMPT = "Answer briefly."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOLS_BY_NAME = {"get_weather": WEATHER_TOOL}
WEATHER_FILE = "weather.json"


def weather_reply(weather: dict, arguments: str) -> str:
    """What the get_weather tool returns for the JSON ``arguments`` the model wrote."""
    try:
        city = json.loads(arguments)["city"]
    except (ValueError, TypeError, KeyError):
        return "error: arguments must be a JSON object with a city"
    if not isinstance(city, str) or city not in weather:
        return "error: unknown city"
    return json.dumps({"city": city, **weather[city]}, ensure_ascii=False)


def chat(base: str, key: str, body: dict) -> dict:
    """One Chat Completions call; returns the reply's message (5xx retried twice)."""
    req = urllib.request.Request(
        base.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"},
    )
    for attempt in range(3):
        try:
            with urllib.request.urlopen(req, timeout=120) as reply:
                return json.load(reply)["choices"][0]["message"]
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or attempt == 2:
                raise
            time.sleep(1 + attempt)
    return {}


def run(prompt: str, base: str, key: str, model: str, tool_names: list, weather: dict) -> str:
    """The conversation loop; returns the final answer text."""
    max_turns = int(os.environ.get("AGENT_MAX_TURNS", "3"))
    max_tokens = int(os.environ.get("AGENT_MAX_TOKENS", "48"))
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]
    body = {"model": model, "messages": messages, "max_tokens": max_tokens}
    if tool_names:
        body["tools"] = [TOOLS_BY_NAME[n] for n in tool_names]
    answer = ""
    for turn in range(max_turns):
        message = chat(base, key, body)
        answer = message.get("content") or ""
        calls = message.get("tool_calls") or []
        print(f"turn {turn}: {answer!r} {len(calls)} tool call(s)", flush=True)
        if not calls:
            break
        messages.append({"role": "assistant", "content": answer, "tool_calls": calls})
        for call in calls:
            fn = call.get("function") or {}
            if fn.get("name") == "get_weather":
                result = weather_reply(weather, fn.get("arguments") or "")
            else:
                result = f"error: unknown tool {fn.get('name')!r}"
            messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": result})
    return answer.strip()


def main() -> None:
    with open(os.environ["ROLLOUT_PROMPT_FILE"]) as f:
        prompt = f.read()
    tool_names = [n for n in os.environ.get("TASK_TOOLS", "").split(",") if n]
    weather: dict = {}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), WEATHER_FILE)
    if os.path.exists(path):
        with open(path) as f:
            weather = json.load(f)
    answer = run(
        prompt,
        os.environ["OPENAI_BASE_URL"],
        os.environ["OPENAI_API_KEY"],
        os.environ.get("ROLLOUT_MODEL", "policy"),
        tool_names,
        weather,
    )
    with open("answer.txt", "w") as f:
        f.write(answer + "\n")


if __name__ == "__main__":
    main()
