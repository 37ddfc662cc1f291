"""The token vocabulary of each published model family the project ships a template for.

A tiny model of a family must tokenize like the real one where it matters: every
structural marker its chat template renders and its output format uses (turn headers,
reasoning tags, tool-call delimiters, end-of-turn tokens) is one token, as in the
published tokenizer, so the Gateway's parsers, end-of-turn detection and token-exact
prompts meet the same ids a served model of that family produces. The words in between
come from our own BPE; only these markers are family-specific.

Markers are special tokens (dropped by ``skip_special_tokens``) except where the published
tokenizer keeps them as plain added tokens that stay in decoded text (``markup``): Qwen's
``<think>``/``<tool_call>`` tags (as in the project's default tiny model) and DeepSeek's
role, reasoning and tool markers.
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict, model_validator


class UnknownFamily(ValueError):
    """A family name the catalog does not know; the message lists the known ones."""


class TokenFamily(BaseModel):
    """One family's added tokens, its bos/eos/pad and its end-of-turn tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """The chat template's name in the real-templates manifest."""
    control: tuple[str, ...]
    """Added tokens marked special (hidden by ``skip_special_tokens``)."""
    markup: tuple[str, ...] = ()
    """Added tokens that are not special: single ids that stay visible in decoded text."""
    bos: str | None
    eos: str
    """``tokenizer_config.json`` ``eos_token`` (what templates read as ``eos_token``)."""
    pad: str
    end_of_turn: tuple[str, ...]
    """``generation_config.json`` ``eos_token_id``, in the published order: every token a
    reply may end with."""

    @property
    def structural(self) -> tuple[str, ...]:
        """Every marker that must encode as exactly one id."""
        return (*self.control, *self.markup)

    @model_validator(mode="after")
    def _consistent(self) -> TokenFamily:
        tokens = self.structural
        if len(set(tokens)) != len(tokens):
            raise ValueError(f"{self.name}: a token is listed twice")
        named = [t for t in (self.bos, self.eos, self.pad, *self.end_of_turn) if t is not None]
        missing = [t for t in named if t not in tokens]
        if missing:
            raise ValueError(f"{self.name}: {missing} are not among the added tokens")
        if self.eos not in self.end_of_turn:
            raise ValueError(f"{self.name}: eos {self.eos!r} must end a turn")
        return self


THINK = ("<think>", "</think>")
QWEN_CONTROL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN_TOOLS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
QWEN_VISION = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
QWEN_ENDS = ("<|im_end|>", "<|endoftext|>")

DEEPSEEK_BOS = "<｜begin▁of▁sentence｜>"
DEEPSEEK_EOS = "<｜end▁of▁sentence｜>"
DEEPSEEK_MARKUP = (
    "<｜User｜>",
    "<｜Assistant｜>",
    *THINK,
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
)
"""Plain added tokens in DeepSeek's tokenizers: role headers, reasoning and tool markers
stay in decoded text. (The R1 distills' Qwen-based vocabulary has no tool markers at all:
there they are several ordinary tokens; here, one each, like V3's.)"""

KIMI_CONTROL = (
    "[BOS]",
    "[EOS]",
    "[PAD]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|media_start|>",
    "<|media_content|>",
    "<|media_end|>",
    "<|media_pad|>",
)

LLAMA_CONTROL = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
)

MISTRAL_NEMO_CONTROL = (
    "<unk>",
    "<s>",
    "</s>",
    "<pad>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
)
MISTRAL_V13_EXTRA = (
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[ARGS]",
    "[CALL_ID]",
    "[THINK]",
    "[/THINK]",
    "[IMG]",
    "[IMG_BREAK]",
    "[IMG_END]",
)


def _qwen(name: str, *, think: bool = True, vision: bool = False) -> TokenFamily:
    return TokenFamily(
        name=name,
        control=(*QWEN_CONTROL, *(QWEN_VISION if vision else ())),
        markup=(*(THINK if think else ()), *QWEN_TOOLS),
        bos=None,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        end_of_turn=QWEN_ENDS,
    )


def _deepseek(name: str, pad: str) -> TokenFamily:
    extra = () if pad == DEEPSEEK_EOS else (pad,)
    return TokenFamily(
        name=name,
        control=(DEEPSEEK_BOS, DEEPSEEK_EOS, *extra),
        markup=DEEPSEEK_MARKUP,
        bos=DEEPSEEK_BOS,
        eos=DEEPSEEK_EOS,
        pad=pad,
        end_of_turn=(DEEPSEEK_EOS,),
    )


def _kimi(name: str, think: bool) -> TokenFamily:
    return TokenFamily(
        name=name,
        control=(*KIMI_CONTROL, *(THINK if think else ())),
        bos="[BOS]",
        eos="<|im_end|>",
        pad="[PAD]",
        end_of_turn=("<|im_end|>",),
    )


def _llama(name: str) -> TokenFamily:
    return TokenFamily(
        name=name,
        control=LLAMA_CONTROL,
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        pad="<|finetune_right_pad_id|>",
        end_of_turn=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
    )


def _mistral(name: str, extra: tuple[str, ...]) -> TokenFamily:
    return TokenFamily(
        name=name,
        control=(*MISTRAL_NEMO_CONTROL, *extra),
        bos="<s>",
        eos="</s>",
        pad="<pad>",
        end_of_turn=("</s>",),
    )


GLM = TokenFamily(
    name="glm-4.7-flash",
    control=(
        "<|endoftext|>",
        "[MASK]",
        "[gMASK]",
        "[sMASK]",
        "<sop>",
        "<eop>",
        "<|system|>",
        "<|user|>",
        "<|assistant|>",
        "<|observation|>",
        *THINK,
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
    ),
    bos=None,
    eos="<|endoftext|>",
    pad="<|endoftext|>",
    end_of_turn=("<|endoftext|>", "<|user|>", "<|observation|>"),
)

HARMONY = TokenFamily(
    name="gpt-oss",
    control=(
        "<|startoftext|>",
        "<|endoftext|>",
        "<|return|>",
        "<|constrain|>",
        "<|channel|>",
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|call|>",
    ),
    bos="<|startoftext|>",
    eos="<|return|>",
    pad="<|endoftext|>",
    end_of_turn=("<|return|>", "<|endoftext|>", "<|call|>"),
)

MINIMAX = TokenFamily(
    name="minimax-m2",
    control=(
        "]~!b[",
        "]~b]",
        "[e~[",
        "]!d~[",
        *THINK,
        "<minimax:tool_call>",
        "</minimax:tool_call>",
    ),
    bos="]~!b[",
    eos="[e~[",
    pad="[e~[",
    end_of_turn=("[e~[",),
)


@cache
def families() -> dict[str, TokenFamily]:
    """Every family, by its template name."""
    entries = (
        _qwen("qwen3"),
        _qwen("qwen3.5", vision=True),
        _qwen("qwen3-coder"),
        _qwen("qwq-32b"),
        _qwen("qwen2.5", think=False),
        _deepseek("deepseek-r1-distill-qwen", pad=DEEPSEEK_EOS),
        _deepseek("deepseek-v3.1", pad="<｜▁pad▁｜>"),
        GLM,
        HARMONY,
        _kimi("kimi-k2", think=False),
        _kimi("kimi-k2-thinking", think=True),
        _llama("llama3.1"),
        _llama("llama3.2"),
        MINIMAX,
        _mistral("ministral-3-reasoning", MISTRAL_V13_EXTRA),
        _mistral("mistral-nemo", ()),
    )
    return {f.name: f for f in entries}


def family_names() -> list[str]:
    return sorted(families())


def get_family(name: str) -> TokenFamily:
    """The named family; an unknown name raises `UnknownFamily` listing the known ones."""
    try:
        return families()[name]
    except KeyError:
        raise UnknownFamily(
            f"unknown model family {name!r}; known: {', '.join(family_names())}"
        ) from None
