"""Which family parses a served model's output: detected from its chat template, or named
with vLLM's own parser flags (`--tool-call-parser`, `--reasoning-parser`) so a vLLM
user's command line carries over.

A family here is one chat-template lineage: its tool-call and its reasoning format. vLLM
splits them into two parsers; a (tool-call parser, reasoning parser) pair maps to one
family below.
"""

from __future__ import annotations

from collections.abc import Mapping


class ParserSelectionError(ValueError):
    """The names given (or the template) do not point at one family; says what would."""


VLLM_TOOL_CALL_PARSERS: Mapping[str, Mapping[str | None, str]] = {
    "hermes": {None: "hermes", "qwen3": "qwen3", "deepseek_r1": "qwq-32b"},
    "qwen3_coder": {None: "qwen3-coder", "qwen3": "qwen3.5"},
    "qwen3_xml": {None: "qwen3-coder", "qwen3": "qwen3.5"},
    "glm45": {None: "glm-4.7-flash", "glm45": "glm-4.7-flash", "glm47": "glm-4.7-flash"},
    "glm47": {None: "glm-4.7-flash", "glm45": "glm-4.7-flash", "glm47": "glm-4.7-flash"},
    "openai": {None: "gpt-oss", "openai_gptoss": "gpt-oss"},
    "kimi_k2": {None: "kimi-k2", "kimi_k2": "kimi-k2-thinking"},
    "deepseek_v3": {None: "deepseek-r1-distill-qwen", "deepseek_r1": "deepseek-r1-distill-qwen"},
    "deepseek_v31": {None: "deepseek-v3.1", "deepseek_v3": "deepseek-v3.1"},
    "llama3_json": {None: "llama3.1"},
    "pythonic": {None: "pythonic"},
    "minimax_m2": {None: "minimax-m2", "minimax_m2": "minimax-m2"},
    "mistral": {None: "mistral-nemo", "mistral": "ministral-3-reasoning"},
}
"""vLLM tool-call parser name → {vLLM reasoning parser name or None: our family}."""

VLLM_REASONING_PARSERS: Mapping[str, str] = {
    "qwen3": "qwen3",
    "deepseek_r1": "deepseek-r1-distill-qwen",
    "glm45": "glm-4.7-flash",
    "glm47": "glm-4.7-flash",
    "openai_gptoss": "gpt-oss",
    "kimi_k2": "kimi-k2-thinking",
    "deepseek_v3": "deepseek-v3.1",
    "minimax_m2": "minimax-m2",
    "mistral": "ministral-3-reasoning",
}
"""vLLM reasoning parser name → our family, when no tool-call parser is named."""


def family_for(
    tool_call_parser: str | None, reasoning_parser: str | None, detected: str | None
) -> str:
    """The family the flags name; without flags, the one detected from the template.

    A reasoning parser alone keeps the detected family when the two agree (e.g. a Qwen3
    template with `--reasoning-parser qwen3`)."""
    if tool_call_parser is not None:
        pairs = VLLM_TOOL_CALL_PARSERS.get(tool_call_parser)
        if pairs is None:
            raise ParserSelectionError(
                f"unknown --tool-call-parser {tool_call_parser!r}; "
                f"known: {', '.join(sorted(VLLM_TOOL_CALL_PARSERS))}"
            )
        if reasoning_parser not in pairs:
            known = ", ".join(sorted(name for name in pairs if name is not None)) or "none"
            raise ParserSelectionError(
                f"--reasoning-parser {reasoning_parser!r} does not go with --tool-call-parser "
                f"{tool_call_parser!r}; with it: {known} (or no --reasoning-parser)"
            )
        return pairs[reasoning_parser]
    if reasoning_parser is not None:
        if reasoning_parser not in VLLM_REASONING_PARSERS:
            raise ParserSelectionError(
                f"unknown --reasoning-parser {reasoning_parser!r}; "
                f"known: {', '.join(sorted(VLLM_REASONING_PARSERS))}"
            )
        if detected is not None and any(
            pairs.get(reasoning_parser) == detected for pairs in VLLM_TOOL_CALL_PARSERS.values()
        ):
            return detected
        return VLLM_REASONING_PARSERS[reasoning_parser]
    if detected is None:
        raise ParserSelectionError(
            "cannot tell the model family from its chat template; name it with "
            "--tool-call-parser (and --reasoning-parser) as for vLLM, or --family"
        )
    return detected


_SIGNATURES: tuple[tuple[tuple[str, ...], str, str | None], ...] = (
    # (strings the template contains, family, family when it also reasons in <think>)
    (("<|channel|>",), "gpt-oss", None),
    (("<minimax:tool_call>",), "minimax-m2", None),
    (("<arg_key>",), "glm-4.7-flash", None),
    (("<|tool_calls_section_begin|>",), "kimi-k2", "kimi-k2-thinking"),
    (("<｜tool▁calls▁begin｜>", "tool['type']"), "deepseek-r1-distill-qwen", None),
    (("<｜tool▁calls▁begin｜>",), "deepseek-v3.1", None),
    (("<function=",), "qwen3-coder", "qwen3.5"),
    (("[TOOL_CALLS]", "[THINK]"), "ministral-3-reasoning", None),
    (("[TOOL_CALLS]",), "mistral-nemo", None),
    (("<|python_tag|>",), "llama3.1", None),
    (("<|start_header_id|>",), "llama3.2", None),
    (("<|im_start|>assistant\\n<think>",), "qwq-32b", None),
    (("<tool_call>",), "qwen2.5", "qwen3"),
)


def detect_family(chat_template: str) -> str | None:
    """The family whose markers the chat template writes; None when none matches."""
    for needles, family, reasoning_family in _SIGNATURES:
        if all(needle in chat_template for needle in needles):
            if reasoning_family is not None and "<think>" in chat_template:
                return reasoning_family
            return family
    return None
