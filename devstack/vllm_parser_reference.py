"""vLLM's own output parsers as a reference: run by the vLLM CPU venv's python, never imported.

Our parsers must split a model's output the way vLLM does for the same family, so the
differential test feeds both the same texts. This script is the vLLM side. It reads JSON
lines on stdin, one case each::

    {"tool_parser": "hermes" | null, "reasoning_parser": "qwen3" | null,
     "model_dir": "...", "text": "...", "token_ids": [..] | null, "tools": [..] | null,
     "request_overrides": {..} | null, "prompt_text": "..." | null,
     "is_harmony": true | false | null, "chunk_sizes": [1, 2, ...]}

and writes one JSON line per case::

    {"whole": {"reasoning", "content", "tool_calls": [{"id", "name", "arguments"}], "error"},
     "streamed": {"<chunk size>": same shape}, "text_seen": "...",
     "skip_special_tokens": bool, "error": null | "why nothing ran"}

It mirrors what vLLM's chat serving does rather than calling the parsers' methods in
isolation, because the chaining (reasoning first, then tools on what is left; the
prompt's open reasoning block; the flush at the end of a stream) is where formats differ:

* the parser class comes from ``ParserManager.get_parser``, one instance per response,
  built with the request's tools and chat-template kwargs. It is the harmony parser when
  the model is gpt-oss: vLLM tells from ``model_type``; the tiny family models all have
  Qwen3's, so here the ``openai`` parser names tell too (``is_harmony`` overrides);
* the request is a real ``ChatCompletionRequest`` passed through the parser's
  ``adjust_request`` first (it may turn ``skip_special_tokens`` off);
* the text the parser sees is what vLLM's detokenizer would produce from the token IDs:
  the tokenizer's ``DecodeStream`` primed with the prompt, honouring
  ``skip_special_tokens``, with a final end-of-sequence token dropped from the text but
  kept in the IDs. ``text_seen`` reports it. A harmony (gpt-oss) case is tokenized with
  the harmony encoding ``openai_harmony`` ships (it works offline), because vLLM's
  harmony parser reads IDs of that vocabulary, whatever tokenizer the model dir holds;
* whole: ``Parser.parse(text, request, enable_auto_tools=True, model_output_token_ids)``;
* streamed: ``Parser.parse_delta`` per group of ``chunk size`` tokens (vLLM streams per
  engine step, i.e. per token or per group of tokens), ``finished`` on the last group;
  the deltas are accumulated the way an OpenAI client does (strings appended, tool calls
  merged by index).

Only vLLM, its dependencies and the standard library are imported: the venv has none of
the project's packages. vLLM's log lines go to stderr; stdout carries only results.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}.items():
    os.environ.setdefault(_key, _value)

# Results get a private copy of stdout; anything else printing to fd 1 (vLLM's logger,
# warnings from native code) lands on stderr instead of corrupting the protocol.
_RESULTS = os.fdopen(os.dup(1), "w", encoding="utf-8")
os.dup2(2, 1)
sys.stdout = sys.stderr

import tokenizers  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.parser import ParserManager  # noqa: E402
from vllm.tokenizers import get_tokenizer  # noqa: E402

_TOKENIZERS: dict[str, Any] = {}


def _tokenizer(model_dir: str) -> Any:
    if model_dir not in _TOKENIZERS:
        _TOKENIZERS[model_dir] = get_tokenizer(model_dir)
    return _TOKENIZERS[model_dir]


def _model_config(model_dir: str) -> Any:
    """The two attributes parsers read off vLLM's ModelConfig (the model type decides
    e.g. Kimi's ``functions.NAME:N`` call ids); a full ModelConfig would load weights'
    metadata and try the hub."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    hf_config = SimpleNamespace(model_type=config.get("model_type"))
    text_config = SimpleNamespace(
        model_type=(config.get("text_config") or {}).get("model_type", config.get("model_type"))
    )
    return SimpleNamespace(hf_config=hf_config, hf_text_config=text_config, hf_overrides={})


def _stop_token_ids(model_dir: str, tokenizer: Any) -> set[int]:
    """IDs whose sampling ends the output (and whose text vLLM then leaves out)."""
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        try:
            eos = json.loads((Path(model_dir) / name).read_text()).get("eos_token_id")
        except (OSError, ValueError):
            continue
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list):
            ids.update(i for i in eos if isinstance(i, int))
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class _HarmonyTokenizer:
    """gpt-oss's real tokenizer (the harmony encoding, shipped inside ``openai_harmony``,
    no download): vLLM's harmony parser reads token IDs of that vocabulary, which a tiny
    model's tokenizer does not have."""

    def __init__(self) -> None:
        from vllm.entrypoints.openai.parser.harmony_utils import get_encoding

        self._encoding = get_encoding()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._encoding.encode(text, allowed_special="all"))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        if skip_special_tokens:
            ids = [i for i in ids if not self._encoding.is_special_token(i)]
        return self._encoding.decode(ids)


class _Detokenizer:
    """vLLM's incremental detokenization: a ``DecodeStream`` primed with the prompt; the
    slow path (prefix decoding) only for tokenizers without a Rust backend."""

    def __init__(self, tokenizer: Any, prompt_ids: list[int], skip_special: bool) -> None:
        self._backend = getattr(tokenizer, "_tokenizer", None)
        self._tokenizer = tokenizer
        self._skip = skip_special
        self._ids: list[int] = []
        self._text = ""
        if isinstance(self._backend, tokenizers.Tokenizer):
            self._stream = tokenizers.decoders.DecodeStream(
                ids=list(prompt_ids), skip_special_tokens=skip_special
            )
        else:
            self._stream = None

    def next(self, token_id: int) -> str:
        if self._stream is not None:
            return self._stream.step(self._backend, token_id) or ""
        self._ids.append(token_id)
        text = self._tokenizer.decode(self._ids, skip_special_tokens=self._skip)
        if text.endswith("\ufffd") or not text.startswith(self._text):
            return ""
        delta, self._text = text[len(self._text) :], text
        return delta


def _shape(reasoning: Any, content: Any, calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"reasoning": reasoning, "content": content, "tool_calls": calls, "error": None}


def _failed(exc: BaseException) -> dict[str, Any]:
    out = _shape(None, None, [])
    out["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return out


def _request(case: dict[str, Any]) -> ChatCompletionRequest:
    data: dict[str, Any] = {
        "model": "reference",
        "messages": [{"role": "user", "content": "reference"}],
    }
    if case.get("tools"):
        data["tools"] = case["tools"]
    data.update(case.get("request_overrides") or {})
    return ChatCompletionRequest.model_validate(data)


def _is_harmony(case: dict[str, Any], model_dir: str) -> bool:
    if case.get("is_harmony") is not None:
        return bool(case["is_harmony"])
    return _model_config(model_dir).hf_config.model_type == "gpt_oss" or (
        case.get("tool_parser") == "openai" or case.get("reasoning_parser") == "openai_gptoss"
    )


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    model_dir = str(case["model_dir"])
    tokenizer = _tokenizer(model_dir)
    harmony = _is_harmony(case, model_dir)
    parser_cls = ParserManager.get_parser(
        tool_parser_name=case.get("tool_parser"),
        reasoning_parser_name=case.get("reasoning_parser"),
        enable_auto_tools=True,
        model_name=model_dir,
        is_harmony=harmony,
        tokenizer=tokenizer,
    )
    if parser_cls is None:
        raise ValueError("neither a tool parser nor a reasoning parser was named")
    request = _request(case)
    model_config = _model_config(model_dir)
    template_kwargs = request.build_chat_params(None, "auto").chat_template_kwargs

    def make_parser() -> Any:
        parser = parser_cls(
            tokenizer,
            request.tools,
            chat_template_kwargs=dict(template_kwargs),
            model_config=model_config,
        )
        if harmony:  # its error recovery decodes the IDs: they are the harmony encoding's
            parser.model_tokenizer = _HarmonyTokenizer()
        return parser

    request = make_parser().adjust_request(request)
    skip_special = bool(request.skip_special_tokens)

    # A harmony model's IDs are the harmony encoding's, whatever the model dir holds.
    ids_tokenizer = _HarmonyTokenizer() if harmony else tokenizer
    ids = case.get("token_ids")
    if ids is None:
        ids = ids_tokenizer.encode(case["text"], add_special_tokens=False)
    ids = [int(i) for i in ids]
    prompt_text = case.get("prompt_text")
    prompt_ids = (
        ids_tokenizer.encode(prompt_text, add_special_tokens=False) if prompt_text else None
    )
    stop_ids = (
        set(ids_tokenizer.encode("<|return|><|call|>"))
        if harmony
        else _stop_token_ids(model_dir, tokenizer)
    )

    def deltas(chunk: int) -> list[tuple[str, list[int]]]:
        detok = _Detokenizer(ids_tokenizer, prompt_ids or [], skip_special)
        out: list[tuple[str, list[int]]] = []
        for start in range(0, len(ids), chunk):
            group = ids[start : start + chunk]
            last = start + chunk >= len(ids)
            text_ids = group[:-1] if last and group and group[-1] in stop_ids else group
            out.append(("".join(detok.next(i) for i in text_ids), group))
        return out

    text_seen = "".join(text for text, _ in deltas(1))

    try:
        parser = make_parser()
        if prompt_ids is not None:
            parser.set_prompt_token_ids(prompt_ids)
        reasoning, content, calls = parser.parse(
            text_seen, request, enable_auto_tools=True, model_output_token_ids=ids
        )
        whole = _shape(
            reasoning if request.include_reasoning else None,
            content,
            [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls or []],
        )
    except Exception as exc:  # a parser bug is a result to report, not a crash
        whole = _failed(exc)

    streamed: dict[str, Any] = {}
    for chunk in case.get("chunk_sizes") or []:
        try:
            streamed[str(chunk)] = _stream(make_parser(), request, deltas(int(chunk)), prompt_ids)
        except Exception as exc:
            streamed[str(chunk)] = _failed(exc)
    return {
        "whole": whole,
        "streamed": streamed,
        "text_seen": text_seen,
        "skip_special_tokens": skip_special,
        "error": None,
    }


def _stream(
    parser: Any,
    request: ChatCompletionRequest,
    deltas: list[tuple[str, list[int]]],
    prompt_ids: list[int] | None,
) -> dict[str, Any]:
    reasoning: str | None = None
    content: str | None = None
    calls: dict[int, dict[str, Any]] = {}
    for n, (text, group) in enumerate(deltas):
        message = parser.parse_delta(
            delta_text=text,
            delta_token_ids=list(group),
            request=request,
            prompt_token_ids=prompt_ids,
            finished=n == len(deltas) - 1,
        )
        if message is None:
            continue
        if message.reasoning:
            reasoning = (reasoning or "") + message.reasoning
        if message.content:
            content = (content or "") + message.content
        for call in message.tool_calls or []:
            slot = calls.setdefault(call.index, {"id": None, "name": None, "arguments": ""})
            if call.id:
                slot["id"] = call.id
            if call.function is not None:
                if call.function.name:
                    slot["name"] = (slot["name"] or "") + call.function.name
                if call.function.arguments:
                    slot["arguments"] += call.function.arguments
    return _shape(reasoning, content, [calls[i] for i in sorted(calls)])


def main() -> int:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            result = run_case(json.loads(line))
        except Exception as exc:
            result = {
                "whole": None,
                "streamed": {},
                "text_seen": None,
                "skip_special_tokens": None,
                "error": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            }
        _RESULTS.write(json.dumps(result, ensure_ascii=False) + "\n")
        _RESULTS.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
