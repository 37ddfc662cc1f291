"""The tiny model builder: determinism, tokenizer properties, chat template behaviour."""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from devstack.tiny_model import (
    IM_END,
    MARKUP_TOKENS,
    SPECIAL_TOKENS,
    TinyModelInfo,
    build_tiny_model,
    builder,
    chat_template_text,
    ensure_tiny_model,
    find_reencode_divergence,
    render_chat,
    source_fingerprint,
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather <for> a city & region",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> TinyModelInfo:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tokenizer(built: TinyModelInfo) -> Tokenizer:
    return Tokenizer.from_file(str(built.out_dir / "tokenizer.json"))


def test_build_is_byte_identical(built: TinyModelInfo, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again")
    assert {k: v.sha256 for k, v in again.files.items()} == {
        k: v.sha256 for k, v in built.files.items()
    }
    assert set(built.files) >= {
        "tokenizer.json",
        "tokenizer_config.json",
        "config.json",
        "generation_config.json",
        "model.safetensors",
    }
    corpus_size = built.files["corpus.txt"].size
    assert 500_000 < corpus_size < 5_000_000


def test_ensure_tiny_model_caches_by_fingerprint(tmp_path: Path) -> None:
    first = ensure_tiny_model(tmp_path)
    assert first.name == f"tiny-model-{source_fingerprint()}"
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tiny-model-")] == []


def test_fingerprint_covers_the_word_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "tiny_model"
    source = Path(str(resources.files(builder.__package__)))
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(builder.resources, "files", lambda _package: copy)
    unchanged = source_fingerprint()
    nouns = copy / "words" / "nouns.txt"
    nouns.write_text(nouns.read_text("utf-8") + "lantern\n", encoding="utf-8")
    assert source_fingerprint() != unchanged


def test_warm_only_sources_leave_the_random_model_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Editing the task family or the warm-up must not rebuild the random model."""
    copy = tmp_path / "tiny_model"
    source = Path(str(resources.files(builder.__package__)))
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(builder.resources, "files", lambda _package: copy)
    unchanged = source_fingerprint()
    for name in builder.WARM_SOURCES:
        (copy / name).write_text((copy / name).read_text("utf-8") + "# edited\n")
    assert source_fingerprint() == unchanged
    (copy / "weights.py").write_text((copy / "weights.py").read_text("utf-8") + "# edited\n")
    assert source_fingerprint() != unchanged


def test_special_and_markup_tokens_are_single_ids(
    built: TinyModelInfo, tokenizer: Tokenizer
) -> None:
    for token in (*SPECIAL_TOKENS, *MARKUP_TOKENS):
        ids = tokenizer.encode(f"x{token}y", add_special_tokens=False).ids
        assert built.token_ids[token] in ids, token
    decoded = tokenizer.decode(
        [built.token_ids["<think>"], built.token_ids[IM_END]], skip_special_tokens=True
    )
    assert decoded == "<think>"  # markup stays visible, control tokens are special
    assert built.eos_token_id == built.token_ids[IM_END]


def test_config_matches_tokenizer(built: TinyModelInfo) -> None:
    config = json.loads((built.out_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["head_dim"] == 64
    assert config["vocab_size"] % 64 == 0
    assert config["vocab_size"] >= built.tokenizer_size
    assert config["eos_token_id"] == built.eos_token_id
    tok_config = json.loads((built.out_dir / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == chat_template_text()
    assert tok_config["eos_token"] == "<|im_end|>"
    assert tok_config["pad_token"] == "<|endoftext|>"


def test_weights_shapes_and_init(built: TinyModelInfo) -> None:
    tensors = load_file(str(built.out_dir / "model.safetensors"))
    config = json.loads((built.out_dir / "config.json").read_text())
    embed = tensors["model.embed_tokens.weight"]
    assert embed.shape == (config["vocab_size"], config["hidden_size"])
    assert "lm_head.weight" not in tensors  # tied embeddings
    assert abs(float(embed.std()) - 0.02) < 0.002
    q = tensors["model.layers.0.self_attn.q_proj.weight"]
    assert q.shape == (config["num_attention_heads"] * 64, config["hidden_size"])
    # Stored as float32 but exactly representable in bfloat16.
    assert not np.any(embed.view(np.uint32) & np.uint32(0xFFFF))


def test_cjk_words_are_merged(tokenizer: Tokenizer) -> None:
    for word in ("天气", "北京"):
        assert len(tokenizer.encode(word).ids) == 1, word
    assert (
        tokenizer.decode(tokenizer.encode("北京今天的天气怎么样？").ids) == "北京今天的天气怎么样？"
    )


def test_reencode_divergence_example(tokenizer: Tokenizer, built: TinyModelInfo) -> None:
    example = find_reencode_divergence(tokenizer)
    assert example.text == "天气"
    assert len(example.sampled_ids) == len(example.text) == 2
    assert tokenizer.decode(example.sampled_ids) == example.text
    assert tokenizer.encode(example.text).ids == example.reencoded_ids != example.sampled_ids
    assert example == built.reencode_example
    assert find_reencode_divergence(built.out_dir / "tokenizer.json") == example


def test_reencode_divergence_scans_vocab_when_preferred_absent(tokenizer: Tokenizer) -> None:
    example = find_reencode_divergence(tokenizer, preferred=())
    assert len(example.sampled_ids) > len(example.reencoded_ids)


# --- chat template -----------------------------------------------------------------


def test_system_user_generation_prompt() -> None:
    text = render_chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "你好"}],
        add_generation_prompt=True,
    )
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n你好<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_enable_thinking_false_prefills_empty_think() -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert render_chat(messages, add_generation_prompt=True, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert render_chat(messages, add_generation_prompt=True, enable_thinking=True).endswith(
        "<|im_start|>assistant\n"
    )
    assert not render_chat(messages).endswith("assistant\n")


def test_tools_section_in_system_turn() -> None:
    text = render_chat(
        [{"role": "system", "content": "Sys."}, {"role": "user", "content": "q"}],
        tools=[WEATHER_TOOL],
    )
    system_turn = text.split("<|im_end|>")[0]
    assert system_turn.startswith("<|im_start|>system\nSys.\n\n")
    # tojson as transformers does it: no HTML escaping, keys in given order.
    assert json.dumps(WEATHER_TOOL, ensure_ascii=False) in system_turn
    assert "<tool_call>\n{" in system_turn and "</tool_call>" in system_turn
    no_system = render_chat([{"role": "user", "content": "q"}], tools=[WEATHER_TOOL])
    assert no_system.startswith("<|im_start|>system\n## Available tools")


def _agent_conversation(args: Any) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "北京天气?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "need the weather",
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": args},
                },
                {
                    "id": "b",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "上海"}},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "晴"},
        {"role": "tool", "tool_call_id": "b", "content": "雨"},
        {"role": "assistant", "content": "<think>\ncompare\n</think>\n\n北京晴，上海雨。"},
    ]


def test_tool_calls_null_content_and_merged_tool_results() -> None:
    text = render_chat(_agent_conversation({"city": "北京"}))
    assert text == (
        "<|im_start|>user\n北京天气?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nneed the weather\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "北京"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "上海"}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n晴\n</tool_response>\n"
        "<tool_response>\n雨\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\ncompare\n</think>\n\n北京晴，上海雨。<|im_end|>\n"
    )


def test_tool_call_arguments_as_json_string_render_the_same() -> None:
    as_dict = render_chat(_agent_conversation({"city": "北京"}))
    as_string = render_chat(_agent_conversation('{"city": "北京"}'))
    assert as_dict == as_string


def test_reasoning_dropped_before_last_user_query() -> None:
    conversation = [
        *_agent_conversation({"city": "北京"}),
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "ok", "reasoning_content": "polite"},
    ]
    text = render_chat(conversation)
    assert "need the weather" not in text and "compare" not in text
    assert "<|im_start|>assistant\n北京晴，上海雨。<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\npolite\n</think>\n\nok<|im_end|>\n")
    # Not append-only: the earlier render is not a prefix of the later one.
    earlier = render_chat(_agent_conversation({"city": "北京"}))
    assert not text.startswith(earlier)


def test_tool_results_are_not_a_user_query() -> None:
    """Reasoning after tool results (wrapped as a user turn) is kept."""
    conversation = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "r1",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "x"}}}],
        },
        {"role": "user", "content": "<tool_response>\nsun\n</tool_response>"},
        {"role": "assistant", "content": "done", "reasoning_content": "r2"},
    ]
    text = render_chat(conversation)
    assert "<think>\nr1\n</think>" in text and "<think>\nr2\n</think>" in text
    assert (
        '<|im_start|>assistant\n<think>\nr1\n</think>\n\n<tool_call>\n{"name": "get_weather"'
        in text
    )


def test_content_parts_and_no_reasoning_after_query() -> None:
    text = render_chat(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "c"}]},
        ]
    )
    assert text == (
        "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nc<|im_end|>\n"
    )


def test_generation_prompt_plus_output_matches_rerender() -> None:
    """With thinking off, prompt + sampled answer renders exactly as the echoed turn."""
    messages = [{"role": "user", "content": "hi"}]
    prompt = render_chat(messages, add_generation_prompt=True, enable_thinking=False)
    echoed = render_chat([*messages, {"role": "assistant", "content": "hello"}])
    assert echoed == prompt + "hello<|im_end|>\n"
