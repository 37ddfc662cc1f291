"""The Gateway's prompt ids against vLLM 0.32's own rendering, every family, every shape.

For each tiny family model, vLLM's GPU-less render server (`vllm launch render`: no
weights, ~10 s to start, one per family for the whole module) renders each conversation
of `tests/fixtures/parity_conversations.py` through `/v1/chat/completions/render`,
`/v1/messages/render` and `/v1/responses/render`, with the family's tool-call and
reasoning parsers named as a deployment would. The same request goes to a Gateway, in a
fresh session, in front of a scripted engine (a FAKE LLM: it records the prompt ids it
was sent and answers "Done."), so the ids compared are the ones the Gateway really sends:
protocol conversion, planning and rendering all ran.

Every pair is identical, or a row of `KNOWN` says exactly how it differs (first
differing index, both lengths and the text of both ids from there) or who refuses it
with which message, with its reason. A row that stops differing, or differs in another
way, fails. When both refuse, the Gateway's 400 carries the template's own message, as
vLLM's does; a case only vLLM refuses (its message conversion breaks the template) is a
row too.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine
from devstack.tiny_families import ensure_family_model, family_names, get_family
from devstack.tiny_families import served_model_name as tiny_model_name
from devstack.vllm_server import VllmServer, VllmServerConfig, VllmServerError
from gateway.parsers.registry import SHIPPED
from tests.fixtures.parity_conversations import (
    CONVERSATIONS,
    PROTOCOLS,
    REQUEST_BUILDERS,
    Conversation,
    Protocol,
)
from tests.fixtures.real_templates import real_templates_dir
from tests.fixtures.render_parity_rows import KNOWN, Differs, Refused
from workers.local_stack import InProcessGateway, start_gateway

pytestmark = [pytest.mark.integration, pytest.mark.needs("vllm_venv")]

RENDER_PATHS: dict[Protocol, str] = {
    "chat": "/v1/chat/completions/render",
    "messages": "/v1/messages/render",
    "responses": "/v1/responses/render",
}
GATEWAY_PATHS: dict[Protocol, str] = {
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
}
SHOWN = 12
"""Ids shown from the first difference on, as text."""


Outcome = Differs | Refused | None
"""None: identical ids."""


def _vllm_parsers(family: str) -> list[str]:
    """The parser flags a deployment of the family names (its declared vLLM names)."""
    declared = {f.name: f for f in SHIPPED}
    own = declared[family]
    fallback = {"qwen2.5": "hermes", "llama3.2": "llama3_json"}
    tool = own.vllm_tool_parsers[0] if own.vllm_tool_parsers else fallback[family]
    reasoning = next((r for r in own.vllm_reasoning_parsers if r is not None), None)
    flags = ["--enable-auto-tool-choice", "--tool-call-parser", tool]
    return flags + (["--reasoning-parser", reasoning] if reasoning else [])


@dataclass
class FamilyRig:
    family: str
    model: str
    tokenizer: Tokenizer
    vllm: VllmServer
    engine: ScriptedEngine
    gateway: InProcessGateway


class RenderServers:
    """Each family's render server, booted one family ahead: the next one starts (~10 s,
    mostly imports) while the current family's cases run."""

    def __init__(self, python: Path, order: list[str]) -> None:
        self._python = python
        self._order = order
        self._pool = ThreadPoolExecutor(max_workers=1)
        self._booting: dict[str, Future[VllmServer]] = {}

    def _boot(self, family: str) -> Future[VllmServer]:
        if family not in self._booting:
            server = VllmServer(
                VllmServerConfig(
                    model_dir=ensure_family_model(family),
                    python=self._python,
                    served_model_name=tiny_model_name(family),
                    max_model_len=8192,
                    render_only=True,
                    extra_args=_vllm_parsers(family),
                )
            )
            self._booting[family] = self._pool.submit(server.start)
        return self._booting[family]

    def take(self, family: str) -> VllmServer:
        booting = self._boot(family)
        later = self._order[self._order.index(family) + 1 :] if family in self._order else []
        if later:
            self._boot(later[0])
        try:
            return booting.result()
        except VllmServerError as exc:
            pytest.fail(f"vLLM render server did not start: {exc}", pytrace=False)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for booting in self._booting.values():
            if booting.exception() is None:
                booting.result().stop()


@pytest.fixture(scope="module")
def render_servers(request: pytest.FixtureRequest, vllm_python: Path) -> Iterator[RenderServers]:
    real_templates_dir()  # fail at once, saying how to get them, when they are missing
    params = [getattr(item, "callspec", None) for item in request.session.items]
    selected = [p.params["rig"] for p in params if p is not None and "rig" in p.params]
    servers = RenderServers(vllm_python, list(dict.fromkeys(selected)))
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture(scope="module", params=family_names())
def rig(
    request: pytest.FixtureRequest,
    render_servers: RenderServers,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[FamilyRig]:
    family = request.param
    model_dir = ensure_family_model(family)
    model = tiny_model_name(family)
    server = render_servers.take(family)
    engine = ScriptedEngine(
        model_dir / "tokenizer.json",
        Script(default_reply="Done."),
        eos_token=get_family(family).eos,
        model=model,
    )
    try:
        with BackgroundServer(engine.app()) as engine_server:
            data_dir = tmp_path_factory.mktemp(f"gw-{family}")
            gateway = start_gateway(engine_server.url, model_dir, data_dir, model)
            try:
                yield FamilyRig(family, model, engine.tokenizer, server, engine, gateway)
            finally:
                gateway.stop()
    finally:
        server.stop()


def _message(reply: httpx.Response) -> str:
    """The error text of a 4xx reply, whatever the shape (vLLM's, OpenAI's, Anthropic's)."""
    try:
        body = reply.json()
    except ValueError:
        return reply.text
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or error)
    return str(error)


def _vllm_ids(rig: FamilyRig, protocol: Protocol, body: dict[str, Any]) -> list[int] | str:
    reply = httpx.post(f"{rig.vllm.url}{RENDER_PATHS[protocol]}", json=body, timeout=60)
    if reply.status_code == 400:
        return _message(reply)
    assert reply.status_code == 200, reply.text
    return reply.json()["token_ids"]  # the engine request vLLM would run


def _gateway_ids(rig: FamilyRig, protocol: Protocol, body: dict[str, Any]) -> list[int] | str:
    """What the engine received for the request (the session's one recorded call), or the
    Gateway's refusal."""
    session = rig.gateway.create_session()
    headers = {"authorization": f"Bearer {session['token']}", "x-api-key": session["token"]}
    root = session["anthropic_base_url"]
    reply = httpx.post(f"{root}{GATEWAY_PATHS[protocol]}", json=body, headers=headers, timeout=60)
    calls = rig.gateway.trajectory(session["session_id"])["calls"]
    if reply.status_code == 400:
        assert calls == [], "a refused request reached the engine"
        return _message(reply)
    assert reply.status_code == 200, reply.text
    (call,) = calls
    assert call["prompt_ids"] in rig.engine.prompts
    return call["prompt_ids"]


def _text(tokenizer: Tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


def outcome(rig: FamilyRig, conv: Conversation, protocol: Protocol) -> Outcome:
    body = REQUEST_BUILDERS[protocol](conv, rig.model)
    theirs = _vllm_ids(rig, protocol, body)
    ours = _gateway_ids(rig, protocol, body)
    if isinstance(theirs, str) or isinstance(ours, str):
        return Refused(
            vllm=theirs if isinstance(theirs, str) else None,
            gateway=ours if isinstance(ours, str) else None,
        )
    if theirs == ours:
        return None
    at = next((i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b), None)
    at = min(len(theirs), len(ours)) if at is None else at
    return Differs(
        at=at,
        vllm_len=len(theirs),
        gateway_len=len(ours),
        vllm=_text(rig.tokenizer, theirs[at : at + SHOWN]),
        gateway=_text(rig.tokenizer, ours[at : at + SHOWN]),
    )


CASES = [(c, p) for c in CONVERSATIONS for p in PROTOCOLS if p in c.shapes]


def test_gateway_prompt_ids_match_vllm_render(rig: FamilyRig) -> None:
    """Every case of the family at once (a few in flight: each waits on two servers)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        seen = dict(
            zip(
                [(c.name, p) for c, p in CASES],
                pool.map(lambda case: outcome(rig, *case), CASES),
                strict=True,
            )
        )
    for (conv, protocol), got in seen.items():
        if isinstance(got, Refused) and got.vllm is not None and got.gateway is not None:
            assert got.vllm in got.gateway, f"{conv}/{protocol}: not the template's message"
    differing = {key: got for key, got in seen.items() if got is not None}
    known = {(c, p): row.outcome for (f, c, p), row in KNOWN.items() if f == rig.family}
    assert differing == known


def test_every_shipped_family_with_a_template_is_compared() -> None:
    """Each registry family is a tiny family here, or named as having no template."""
    without_template = {"pythonic", "hermes"}
    shipped = {f.name for f in SHIPPED}
    assert shipped - without_template == set(family_names())
    assert {k[0] for k in KNOWN} <= set(family_names())
    assert all((c, p) in {(cc.name, pp) for cc, pp in CASES} for _, c, p in KNOWN)
