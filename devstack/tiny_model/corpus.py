"""Deterministic training corpus for the tiny tokenizer.

Machines here cannot download corpora and third-party text must not be copied into the
project, so the text the BPE learns from is generated from the word lists below, all
written for this project. The mix mirrors what agents send through the Gateway: English
prose, code, JSON tool calls, shell commands and Chinese. Chinese words recur often
enough that the BPE learns multi-character merges (e.g. "天气", "北京") -- the case where
decode -> re-encode does not give back the sampled token IDs.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

CORPUS_SEED = 20240611

NOUNS = [
    "agent",
    "file",
    "model",
    "token",
    "server",
    "request",
    "answer",
    "reply",
    "question",
    "task",
    "test",
    "result",
    "value",
    "error",
    "branch",
    "commit",
    "message",
    "window",
    "table",
    "record",
    "sample",
    "batch",
    "policy",
    "reward",
    "gateway",
    "worker",
    "session",
    "sandbox",
    "image",
    "engine",
    "cache",
    "folder",
    "path",
    "line",
    "column",
    "function",
    "class",
    "method",
    "module",
    "package",
    "library",
    "option",
    "number",
    "string",
    "list",
    "map",
    "queue",
    "thread",
    "process",
    "signal",
    "timer",
    "clock",
    "weather",
    "city",
    "river",
    "mountain",
    "forest",
    "garden",
    "kitchen",
    "market",
    "street",
    "bridge",
    "station",
    "library",
    "teacher",
    "student",
    "doctor",
    "friend",
    "family",
    "morning",
    "evening",
    "night",
    "summer",
    "winter",
    "spring",
    "autumn",
    "storm",
    "cloud",
    "rain",
    "snow",
    "wind",
    "sun",
    "moon",
    "paper",
    "letter",
    "story",
    "book",
    "song",
    "picture",
    "idea",
    "plan",
    "reason",
    "problem",
    "solution",
    "change",
    "report",
    "review",
    "patch",
    "network",
    "socket",
    "port",
    "header",
    "body",
    "payload",
    "schema",
    "field",
    "key",
    "config",
    "setting",
    "user",
    "owner",
]

VERBS = [
    "open",
    "close",
    "read",
    "write",
    "run",
    "stop",
    "start",
    "build",
    "check",
    "send",
    "receive",
    "parse",
    "render",
    "fix",
    "update",
    "delete",
    "create",
    "move",
    "copy",
    "find",
    "search",
    "load",
    "save",
    "print",
    "return",
    "call",
    "wait",
    "retry",
    "merge",
    "split",
    "join",
    "sort",
    "count",
    "measure",
    "compare",
    "explain",
    "describe",
    "remember",
    "forget",
    "answer",
    "ask",
    "help",
    "walk",
    "travel",
    "visit",
    "cook",
    "paint",
    "carry",
    "keep",
    "bring",
    "watch",
    "listen",
    "learn",
    "teach",
    "collect",
    "record",
    "replay",
    "restore",
    "schedule",
    "cancel",
    "resume",
    "finish",
    "review",
    "commit",
    "deploy",
]

ADJECTIVES = [
    "small",
    "large",
    "quick",
    "slow",
    "quiet",
    "loud",
    "bright",
    "dark",
    "warm",
    "cold",
    "new",
    "old",
    "early",
    "late",
    "simple",
    "careful",
    "clean",
    "broken",
    "empty",
    "full",
    "short",
    "long",
    "strong",
    "gentle",
    "green",
    "blue",
    "red",
    "yellow",
    "white",
    "black",
    "happy",
    "tired",
    "busy",
    "free",
    "open",
    "closed",
    "local",
    "remote",
    "stable",
    "final",
    "first",
    "last",
    "next",
    "previous",
    "exact",
    "rough",
    "sunny",
    "cloudy",
    "rainy",
    "windy",
    "safe",
    "durable",
    "tiny",
    "huge",
]

ADVERBS = [
    "quickly",
    "slowly",
    "carefully",
    "again",
    "soon",
    "later",
    "often",
    "never",
    "always",
    "today",
    "tomorrow",
]

FUNCTION_WORDS = [
    "the",
    "a",
    "an",
    "this",
    "that",
    "these",
    "those",
    "some",
    "every",
    "each",
    "another",
    "our",
    "their",
    "my",
    "your",
    "its",
]

PREPOSITIONS = [
    "in",
    "on",
    "at",
    "from",
    "to",
    "into",
    "over",
    "under",
    "near",
    "after",
    "before",
    "with",
    "without",
    "for",
]

NAMES = [
    "Alice",
    "Bob",
    "Carol",
    "Dave",
    "Erin",
    "Frank",
    "Grace",
    "Heidi",
    "Ivan",
    "Judy",
    "Mallory",
    "Oscar",
    "Peggy",
    "Trent",
]

CITIES_EN = [
    "beijing",
    "shanghai",
    "shenzhen",
    "hangzhou",
    "chengdu",
    "wuhan",
    "nanjing",
    "xian",
    "tokyo",
    "seoul",
    "paris",
    "london",
    "berlin",
    "madrid",
    "rome",
    "cairo",
    "lima",
    "oslo",
    "boston",
    "denver",
    "austin",
    "seattle",
]

# Common Chinese words and characters, chosen by hand for this project.
CJK_WORDS = [
    "天气",
    "北京",
    "上海",
    "深圳",
    "杭州",
    "成都",
    "武汉",
    "南京",
    "西安",
    "广州",
    "今天",
    "明天",
    "昨天",
    "现在",
    "早上",
    "晚上",
    "我们",
    "你们",
    "他们",
    "这个",
    "那个",
    "什么",
    "怎么",
    "为什么",
    "可以",
    "需要",
    "已经",
    "因为",
    "所以",
    "如果",
    "但是",
    "还是",
    "或者",
    "没有",
    "知道",
    "觉得",
    "喜欢",
    "工作",
    "学习",
    "时间",
    "问题",
    "代码",
    "文件",
    "目录",
    "测试",
    "运行",
    "模型",
    "数据",
    "工具",
    "调用",
    "结果",
    "函数",
    "参数",
    "返回",
    "错误",
    "修改",
    "提交",
    "分支",
    "服务",
    "请求",
    "响应",
    "用户",
    "助手",
    "系统",
    "任务",
    "步骤",
    "训练",
    "奖励",
    "采样",
    "温度",
    "下雨",
    "晴天",
    "多云",
    "刮风",
    "下雪",
    "城市",
    "中国",
    "世界",
    "朋友",
    "老师",
    "学生",
    "医生",
    "电脑",
    "手机",
    "网络",
    "程序",
    "项目",
    "版本",
    "配置",
    "日志",
    "检查",
    "帮助",
    "查询",
    "打开",
    "关闭",
    "开始",
    "结束",
    "完成",
    "失败",
    "成功",
    "重试",
    "等待",
    "发送",
    "接收",
    "读取",
    "写入",
    "删除",
    "创建",
    "更新",
    "安装",
    "启动",
    "停止",
    "天空",
    "太阳",
    "月亮",
    "山水",
    "河流",
    "花园",
    "市场",
    "街道",
    "火车",
    "飞机",
    "银行",
    "医院",
    "学校",
    "公司",
]

CJK_CHARS = [
    "的",
    "一",
    "是",
    "不",
    "了",
    "在",
    "人",
    "有",
    "我",
    "他",
    "这",
    "中",
    "大",
    "来",
    "上",
    "个",
    "国",
    "到",
    "说",
    "们",
    "为",
    "子",
    "和",
    "你",
    "地",
    "出",
    "会",
    "也",
    "时",
    "要",
    "就",
    "下",
    "以",
    "生",
    "能",
    "而",
    "过",
    "年",
    "后",
    "多",
    "天",
    "气",
    "北",
    "京",
    "好",
    "看",
    "想",
    "用",
    "做",
    "很",
    "都",
    "去",
    "把",
    "对",
    "给",
    "从",
    "还",
    "又",
    "再",
    "只",
    "最",
    "新",
    "高",
    "长",
    "水",
    "火",
    "山",
    "风",
    "雨",
    "雪",
    "云",
    "热",
    "冷",
    "东",
    "西",
    "南",
    "书",
    "字",
    "写",
    "读",
    "问",
    "答",
    "开",
    "关",
    "门",
    "车",
    "路",
    "家",
    "心",
    "手",
    "口",
    "目",
    "花",
    "草",
    "树",
    "鱼",
    "鸟",
    "马",
    "牛",
    "羊",
    "米",
    "饭",
    "茶",
    "酒",
]

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

SHELL_PROGRAMS = (
    "ls -la {p}",
    "cat {p}",
    "grep -rn {w} {p}",
    "cd {p} && make test",
    "python -m pytest {p} -q",
    "git status",
    "git diff --stat",
    "git log --oneline -n {n}",
    'git commit -am "{msg}"',
    "git checkout -b {w}-{n}",
    "mkdir -p {p}",
    "rm -rf {p}/build",
    "find {p} -name '*.py' | xargs wc -l",
    "echo {w} > {p}/{w}.txt",
    "pip install {w}=={n}.{m}.0",
    "curl -s http://127.0.0.1:{port}/health",
    "sed -n '{n},{m}p' {p}/{w}.py",
    "head -n {n} {p}/{w}.log",
    "export {W}_LEVEL={n}",
    "tar czf {w}.tar.gz {p}",
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
    return rng.choice(SHELL_PROGRAMS).format(
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
