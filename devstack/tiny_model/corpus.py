"""Deterministic training corpus for the tiny tokenizer.

Machines here cannot download corpora and third-party text must not be copied into the
project, so the text the BPE learns from is generated from the word lists in ``words/``
(one entry per line, all written for this project); this module holds the generators.
The mix mirrors what agents send through the Gateway: English prose, code, JSON tool
calls, shell commands and Chinese. Chinese words recur often enough that the BPE learns
multi-character merges (e.g. "天气", "北京") -- the case where decode -> re-encode does
not give back the sampled token IDs.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from importlib import resources

CORPUS_SEED = 20240611


def _words(name: str) -> list[str]:
    """One entry per line of ``words/<name>.txt``; order and repeats shape the corpus."""
    text = resources.files(__package__).joinpath("words", f"{name}.txt").read_text("utf-8")
    return text.splitlines()


NOUNS = _words("nouns")
VERBS = _words("verbs")
ADJECTIVES = _words("adjectives")
ADVERBS = _words("adverbs")
FUNCTION_WORDS = _words("function_words")
PREPOSITIONS = _words("prepositions")
NAMES = _words("names")
CITIES_EN = _words("cities_en")
CJK_WORDS = _words("cjk_words")
"""Common Chinese words; the weather sentences take their place from the first ten."""
CJK_CHARS = _words("cjk_chars")
SHELL_COMMANDS = tuple(_words("shell_commands"))
"""``str.format`` templates for shell lines (fields p, w, W, n, m, msg, port)."""

CJK_PUNCT = ("，", "。", "？", "！", "、", "：")

TOOL_NAMES = (
    "get_weather",
    "read_file",
    "write_file",
    "run_shell",
    "search_code",
    "list_dir",
    "apply_patch",
    "run_tests",
)


def _path(rng: random.Random) -> str:
    parts = [rng.choice(NOUNS) for _ in range(rng.randint(1, 3))]
    return "/".join(["src", *parts]) if rng.random() < 0.5 else "/".join(parts)


def _identifier(rng: random.Random) -> str:
    words = [rng.choice(VERBS)] + [rng.choice(NOUNS) for _ in range(rng.randint(0, 2))]
    return "_".join(words)


def english_sentence(rng: random.Random) -> str:
    """One English-like sentence from the word lists."""
    subject = rng.choice(NAMES) if rng.random() < 0.3 else f"{rng.choice(FUNCTION_WORDS)} "
    if not subject[0].isupper():
        subject += f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
    words = [subject, rng.choice(VERBS) + ("s" if rng.random() < 0.5 else "")]
    words.append(f"{rng.choice(FUNCTION_WORDS)} {rng.choice(NOUNS)}")
    if rng.random() < 0.6:
        words.append(f"{rng.choice(PREPOSITIONS)} {rng.choice(FUNCTION_WORDS)} {rng.choice(NOUNS)}")
    if rng.random() < 0.4:
        words.append(rng.choice(ADVERBS))
    sentence = " ".join(words)
    sentence = sentence[0].upper() + sentence[1:]
    return sentence + rng.choice((".", ".", ".", "?", "!"))


def english_paragraph(rng: random.Random) -> str:
    return " ".join(english_sentence(rng) for _ in range(rng.randint(2, 6)))


def cjk_sentence(rng: random.Random) -> str:
    """One Chinese sentence; weather questions keep "天气"/"北京" frequent."""
    kind = rng.random()
    if kind < 0.25:
        city = rng.choice(CJK_WORDS[:10])
        day = rng.choice(("今天", "明天", "现在", "晚上"))
        return rng.choice(
            (
                f"{city}{day}的天气怎么样？",
                f"请帮我查询{city}{day}的天气。",
                f"{city}{day}会下雨吗？",
                f"{day}{city}是晴天，温度不高。",
            )
        )
    if kind < 0.4:
        return (
            f"我们需要{rng.choice(('修改', '检查', '运行', '提交'))}这个"
            f"{rng.choice(('文件', '函数', '测试', '项目'))}里的代码。"
        )
    pieces: list[str] = []
    for _ in range(rng.randint(3, 9)):
        pieces.append(rng.choice(CJK_WORDS) if rng.random() < 0.7 else rng.choice(CJK_CHARS))
        if rng.random() < 0.15:
            pieces.append(rng.choice(CJK_PUNCT[:2]))
    return "".join(pieces) + rng.choice(CJK_PUNCT[1:4])


def cjk_paragraph(rng: random.Random) -> str:
    return "".join(cjk_sentence(rng) for _ in range(rng.randint(2, 6)))


def code_block(rng: random.Random) -> str:
    """A few Python-ish or JS-ish lines built from project identifiers."""
    name = _identifier(rng)
    arg = rng.choice(NOUNS)
    other = rng.choice(NOUNS)
    n = rng.randint(0, 99)
    if rng.random() < 0.6:
        lines = [
            f"def {name}({arg}: str, {other}: int = {n}) -> dict[str, int]:",
            f'    """{rng.choice(VERBS).capitalize()} the {arg} and return a {other} map."""',
            "    result = {}",
            f"    for item in {arg}.split(','):",
            f"        if item and len(item) > {other}:",
            f"            result[item] = result.get(item, 0) + {rng.randint(1, 9)}",
            "    return result",
        ]
        if rng.random() < 0.5:
            lines.insert(0, f"from {rng.choice(NOUNS)} import {_identifier(rng)}")
    else:
        lines = [
            f"function {name.replace('_', '')}({arg}, {other}) {{",
            f"  const {other}List = {arg}.map((x) => x * {n});",
            f"  if ({other}List.length === 0) {{ return null; }}",
            f"  return {other}List.filter(Boolean);",
            "}",
        ]
    return "\n".join(lines)


def tool_call_json(rng: random.Random) -> str:
    """A JSON tool call in the shape the chat template asks models to produce."""
    name = rng.choice(TOOL_NAMES)
    if name == "get_weather":
        city = rng.choice(CITIES_EN) if rng.random() < 0.6 else rng.choice(CJK_WORDS[1:10])
        args: dict[str, object] = {"city": city}
        if rng.random() < 0.3:
            args["unit"] = rng.choice(("celsius", "fahrenheit"))
    elif name in ("read_file", "write_file", "list_dir"):
        args = {"path": _path(rng) + (".py" if name != "list_dir" else "")}
        if name == "write_file":
            args["content"] = english_sentence(rng)
    elif name == "run_shell":
        args = {"command": shell_command(rng), "timeout": rng.randint(5, 120)}
    elif name == "search_code":
        args = {"query": rng.choice(NOUNS), "max_results": rng.randint(1, 50)}
    else:
        args = {"target": _path(rng), "verbose": rng.random() < 0.5}
    return json.dumps({"name": name, "arguments": args}, ensure_ascii=False)


def shell_command(rng: random.Random) -> str:
    word = rng.choice(NOUNS)
    return rng.choice(SHELL_COMMANDS).format(
        p=_path(rng),
        w=word,
        W=word.upper(),
        n=rng.randint(1, 40),
        m=rng.randint(41, 90),
        msg=english_sentence(rng).rstrip(".?!").lower(),
        port=rng.randint(1024, 65000),
    )


def shell_session(rng: random.Random) -> str:
    return "\n".join(f"$ {shell_command(rng)}" for _ in range(rng.randint(1, 4)))


def mixed_line(rng: random.Random) -> str:
    """Chinese and English mixed, as agents' Chinese prompts usually are."""
    return f"{cjk_sentence(rng)} {rng.choice(NOUNS)} {rng.choice(CJK_WORDS)}：{tool_call_json(rng)}"


_GENERATORS: tuple[tuple[Callable[[random.Random], str], float], ...] = (
    (english_paragraph, 0.30),
    (cjk_paragraph, 0.30),
    (code_block, 0.15),
    (tool_call_json, 0.10),
    (shell_session, 0.08),
    (mixed_line, 0.07),
)


def generate_corpus(target_chars: int = 1_500_000, seed: int = CORPUS_SEED) -> str:
    """Generate the corpus; the same seed always gives the same text."""
    rng = random.Random(seed)
    funcs = [f for f, _ in _GENERATORS]
    weights = [w for _, w in _GENERATORS]
    chunks: list[str] = []
    size = 0
    while size < target_chars:
        chunk = rng.choices(funcs, weights)[0](rng)
        chunks.append(chunk)
        size += len(chunk) + 1
    return "\n".join(chunks) + "\n"
