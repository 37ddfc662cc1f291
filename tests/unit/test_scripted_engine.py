"""ScriptedEngine keeps every reply it returned (prompt, output IDs, logprobs, rule), so
end-to-end tests can compare a recorded trajectory with what the engine really sampled."""

from pathlib import Path

from starlette.testclient import TestClient

from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from devstack.tiny_families import ensure_family_model


def engine(tiny_model_dir: Path, script: Script) -> ScriptedEngine:
    return ScriptedEngine(tiny_model_dir / "tokenizer.json", script)


def test_replies_are_recorded_with_the_rule_that_answered(tiny_model_dir: Path) -> None:
    script = Script(
        rules=[ScriptRule(when_contains="alpha", reply="first"), ScriptRule(reply="second")],
        default_reply="fallback",
    )
    e = engine(tiny_model_dir, script)
    alpha = e.tokenizer.encode("alpha", add_special_tokens=False).ids
    beta = e.tokenizer.encode("beta", add_special_tokens=False).ids
    with TestClient(e.app()) as client:
        bodies = [
            client.post("/v1/completions", json={"prompt": p, "max_tokens": 64}).json()
            for p in (beta, alpha, beta)
        ]
    assert [r.rule for r in e.replies] == [1, 0, None]
    assert [r.prompt_ids for r in e.replies] == [beta, alpha, beta]
    for body, reply in zip(bodies, e.replies, strict=True):
        choice = body["choices"][0]
        assert choice["token_ids"] == reply.output_ids
        assert choice["logprobs"]["token_logprobs"] == reply.output_logprobs
        assert choice["finish_reason"] == reply.finish_reason == "stop"
        assert reply.output_ids[-1] == e.eos_id
    assert e.tokenizer.decode(e.replies[2].output_ids) == "fallback"


def test_truncated_reply_is_recorded_as_returned(tiny_model_dir: Path) -> None:
    e = engine(tiny_model_dir, Script(default_reply="a fairly long reply " * 10))
    with TestClient(e.app()) as client:
        body = client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 3}).json()
    (reply,) = e.replies
    assert reply.finish_reason == "length" and len(reply.output_ids) == 3
    assert body["choices"][0]["token_ids"] == reply.output_ids


def test_reset_forgets_replies_and_used_rules(tiny_model_dir: Path) -> None:
    e = engine(tiny_model_dir, Script(rules=[ScriptRule(reply="once")]))
    with TestClient(e.app()) as client:
        client.post("/v1/completions", json={"prompt": [5]})
        client.post("/v1/completions", json={"prompt": [5]})
        assert [r.rule for r in e.replies] == [0, None]
        e.reset()
        assert e.replies == [] and e.prompts == []
        client.post("/v1/completions", json={"prompt": [5]})
        assert [r.rule for r in e.replies] == [0]
        e.reset(Script(default_reply="new"))
        client.post("/v1/completions", json={"prompt": [5]})
    assert e.script.default_reply == "new" and [r.rule for r in e.replies] == [None]


def test_a_reply_ends_at_the_first_end_of_turn_token_it_writes() -> None:
    """gpt-oss ends a tool call with <|call|> and an answer with <|return|> (both stop
    ids of its generation config): a scripted reply that writes one stops right after it,
    with nothing appended; a reply that writes none still gets the eos."""
    model = ensure_family_model("gpt-oss")
    e = ScriptedEngine(
        model / "tokenizer.json",
        Script(
            rules=[
                ScriptRule(reply="<|channel|>final<|message|>hi<|return|>"),
                ScriptRule(reply="<|channel|>commentary<|message|>{}<|call|>trailing<|return|>"),
                ScriptRule(reply="plain"),
            ]
        ),
        eos_token="<|return|>",
        stop_tokens=["<|return|>", "<|call|>"],
    )
    with TestClient(e.app()) as client:
        for _ in range(3):
            client.post("/v1/completions", json={"prompt": [5], "max_tokens": 64})
    texts = [e.tokenizer.decode(r.output_ids, skip_special_tokens=False) for r in e.replies]
    assert texts == [
        "<|channel|>final<|message|>hi<|return|>",
        "<|channel|>commentary<|message|>{}<|call|>",
        "plain<|return|>",
    ]
    assert [r.finish_reason for r in e.replies] == ["stop"] * 3
