"""OpenRLHF learns from our rollouts: an agent executor for `--train.agent_func_path`.

OpenRLHF builds the file's `AgentExecutor` with no arguments in each vLLM rollout actor
and calls `execute(...)` `n_samples_per_prompt` times concurrently per prompt. Here those
n calls join into one group of our rollouts (`GroupGate`), and each call returns its
rollout's primary segment as OpenRLHF's response dict; `llm_engine` is not used.
OpenRLHF reshapes rewards to `(-1, n)`, so a failed rollout still returns a sample: no
action range, its group's baseline mean as reward. The contract: docs/trainers/openrlhf.md.
Only :func:`make_agent_executor` imports `openrlhf`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

from pydantic import Field, ValidationError

from bridges.groups import collect_groups
from bridges.policy import gateway_policy, publish, served_version
from bridges.rollouts import (
    ConversionError,
    ConversionRules,
    ConvertedBatch,
    TrainingGroup,
    TrainingRollout,
    aligned,
)
from bridges.runner import Connection, PerLoop
from bridges.tasks import require_reward
from schemas.tasks import RolloutTask
from schemas.training import policy_version_index

log = logging.getLogger("rollout.bridges.openrlhf")

#: The OpenRLHF release whose agent contract this module was written against.
OPENRLHF_VERSION = "0.11.2"
#: Where OpenRLHF's `--ckpt.save_hf` puts each step's weights: `<ckpt.path>/global_step<N>_hf`.
_HF_CHECKPOINT = re.compile(r"^global_step(\d+)_hf$")
#: The environment variable :func:`make_agent_executor` reads its settings from (JSON).
SETTINGS_ENV = "ROLLOUT_OPENRLHF_SETTINGS"


class OpenRLHFResponse(TypedDict):
    """One `execute` result, the shape OpenRLHF's samples generator reads."""

    prompt: Any
    label: Any
    images: Any
    mm_train_inputs: Any
    observation_tokens: list[int]
    action_ranges: list[tuple[int, int]]
    rollout_log_probs: list[float]
    reward: float
    scores: float
    truncated: bool
    extra_logs: dict[str, float]


class BridgeInputError(ValueError):
    """A prompt/label OpenRLHF handed us cannot become a task; the message names the field."""


# --------------------------------------------------------------------- pure conversion
_POLICY_RUN = re.compile(rb"\x01+")


def action_ranges(loss_mask: Sequence[int], offset: int) -> list[tuple[int, int]]:
    """The `[start, end)` spans where `loss_mask` is 1, shifted by `offset` (the prompt).

    Why via bytes: a C-level scan; a rollout of 8 calls has thousands of mask entries and
    the benchmark converts tens of thousands of rollouts.
    """
    return [(offset + m.start(), offset + m.end()) for m in _POLICY_RUN.finditer(bytes(loss_mask))]


def _extra_logs(rollout: TrainingRollout | None, *, infra_error: bool) -> dict[str, float]:
    """Always the same keys: OpenRLHF concatenates `info` across samples."""
    staleness = rollout.primary.staleness if rollout is not None and rollout.segments else None
    return {
        "agent_infra_error": float(infra_error),
        "agent_num_turns": float(rollout.num_turns) if rollout is not None else 0.0,
        "agent_segments": float(len(rollout.segments)) if rollout is not None else 0.0,
        "agent_staleness": float(staleness or 0),
    }


def rollout_to_response(
    rollout: TrainingRollout,
    *,
    prompt: Any,
    label: Any,
    fill_reward: float,
    placeholder_ids: Sequence[int] = (0,),
) -> OpenRLHFResponse:
    """One rollout → one OpenRLHF sample: its primary segment (OpenRLHF takes one sequence
    per `execute`); a rollout out of the baseline gets `fill_reward` and no action range."""
    if not rollout.segments:
        return fill_response(
            prompt=prompt,
            label=label,
            reward=fill_reward,
            placeholder_ids=placeholder_ids,
            rollout=rollout,
        )
    seg = aligned(rollout.rollout_id, rollout.primary)
    offset = len(seg.prompt_ids)
    counts = rollout.in_baseline
    ranges = action_ranges(seg.loss_mask, offset) if counts and seg.trained else []
    reward = float(rollout.reward) if counts else fill_reward
    return {
        "prompt": prompt,
        "label": label,
        "images": None,
        "mm_train_inputs": None,
        "observation_tokens": seg.prompt_ids + seg.response_ids,
        "action_ranges": ranges,
        "rollout_log_probs": [0.0] * offset + seg.logprobs,
        "reward": reward,
        "scores": reward,
        "truncated": bool(rollout.truncated),
        "extra_logs": _extra_logs(rollout, infra_error=not counts),
    }


def fill_response(
    *,
    prompt: Any,
    label: Any,
    reward: float,
    placeholder_ids: Sequence[int],
    rollout: TrainingRollout | None = None,
) -> OpenRLHFResponse:
    """A sample standing in for a rollout that has no tokens to train on (infra_error, a
    failed workflow, a dropped stale rollout): no action range, the group's fill reward."""
    ids = list(placeholder_ids)
    if not ids:
        rid = rollout.rollout_id if rollout is not None else "?"
        raise ConversionError(rid, "placeholder_ids", "OpenRLHF needs one observation token")
    return {
        "prompt": prompt,
        "label": label,
        "images": None,
        "mm_train_inputs": None,
        "observation_tokens": ids,
        "action_ranges": [],
        "rollout_log_probs": [0.0] * len(ids),
        "reward": reward,
        "scores": reward,
        "truncated": False,
        "extra_logs": _extra_logs(rollout, infra_error=True),
    }


def group_responses(
    group: TrainingGroup,
    size: int,
    *,
    prompt: Any,
    label: Any,
    placeholder_ids: Sequence[int] = (0,),
) -> list[OpenRLHFResponse]:
    """Exactly `size` samples for one prompt, in sample-index order; a missing rollout
    (failed workflow, dropped as stale) becomes a fill sample."""
    if len(group.rollouts) > size:
        raise ConversionError(
            group.rollouts[size].rollout_id,
            "samples_per_prompt",
            f"group {group.group_id} has {len(group.rollouts)} rollouts for {size} samples",
        )
    fill = group.fill_reward()
    by_index = {r.sample_index: r for r in group.rollouts}
    spare = sorted(i for i in by_index if i >= size)  # indexes past `size`: keep, in order
    slots = [by_index.get(i) for i in range(size)]
    for i, slot in enumerate(slots):
        if slot is None and spare:
            slots[i] = by_index[spare.pop(0)]
    return [
        rollout_to_response(
            r, prompt=prompt, label=label, fill_reward=fill, placeholder_ids=placeholder_ids
        )
        if r is not None
        else fill_response(prompt=prompt, label=label, reward=fill, placeholder_ids=placeholder_ids)
        for r in slots
    ]


def convert_batch(
    batch: ConvertedBatch,
    *,
    samples_per_prompt: int | None = None,
    placeholder_ids: Sequence[int] = (0,),
) -> list[OpenRLHFResponse]:
    """The batch as OpenRLHF's per-sample response dicts, group after group.

    `samples_per_prompt` (OpenRLHF's `n_samples_per_prompt`): each group padded to exactly
    that many samples, as OpenRLHF's advantage reshape needs; None: one per rollout. The
    prompt and label of a sample are its task id (the executor echoes OpenRLHF's own).
    """
    out: list[OpenRLHFResponse] = []
    for group in batch.groups:
        size = samples_per_prompt or len(group.rollouts)
        out.extend(
            group_responses(
                group,
                size,
                prompt=group.task_id,
                label=group.task_id,
                placeholder_ids=placeholder_ids,
            )
        )
    return out


# ----------------------------------------------------------------- prompt → our task
def task_from_openrlhf(
    prompt: Any, label: Any, defaults: Mapping[str, Any] | None = None
) -> RolloutTask:
    """OpenRLHF's prompt + label → our `RolloutTask`.

    The contract: `label` (`--data.label_key`) is a JSON object (text or dict) of
    `RolloutTask` fields, laid over `defaults`; `prompt` fills the task's `prompt` when
    the label has none, and a task id is derived from the prompt when it has none.
    Without `--data.apply_chat_template` the prompt is the plain instruction the agent
    receives (its own chat template is applied at the Gateway).
    """
    if isinstance(label, str):
        text = label.strip()
        try:
            fields = json.loads(text) if text else {}
        except json.JSONDecodeError as exc:
            raise BridgeInputError(
                f"label: not a JSON object of task fields ({exc.msg} at {exc.pos}): {text[:80]!r}"
            ) from None
    elif isinstance(label, Mapping):
        fields = dict(label)
    elif label is None:
        fields = {}
    else:
        raise BridgeInputError(
            f"label: expected a JSON object of task fields, got {type(label).__name__}"
        )
    if not isinstance(fields, dict):
        raise BridgeInputError(
            f"label: expected a JSON object of task fields, got {type(fields).__name__}"
        )
    merged = {**(defaults or {}), **fields}
    if "prompt" not in merged:
        if not isinstance(prompt, str) or not prompt:
            raise BridgeInputError("prompt: empty, and the label carries no task prompt")
        merged["prompt"] = prompt
    merged.setdefault("task_id", "t" + hashlib.sha256(merged["prompt"].encode()).hexdigest()[:12])
    try:
        task = RolloutTask.model_validate(merged)
    except ValidationError as exc:
        where = ", ".join(".".join(map(str, e["loc"])) + ": " + e["msg"] for e in exc.errors()[:3])
        raise BridgeInputError(f"label: task {merged.get('task_id')!r}: {where}") from None
    require_reward(task, "label", BridgeInputError)
    return task


# ------------------------------------------------------------------------- settings
class OpenRLHFBridgeSettings(Connection):
    """What the executor needs; OpenRLHF builds it with no arguments, so these come from
    the agent file or `ROLLOUT_OPENRLHF_SETTINGS` (JSON)."""

    output: str = Field(
        description="where rollouts write samples: a directory or s3://bucket/prefix"
    )
    samples_per_prompt: int = Field(
        ge=2, description="must equal OpenRLHF's --rollout.n_samples_per_prompt (a GRPO group)"
    )
    checkpoint_root: str | None = Field(
        default=None,
        description="OpenRLHF's --ckpt.path; with --ckpt.save_hf each global_step<N>_hf is "
        "published as <run_id>-v<N> before the next group starts (needs `gateway`)",
    )
    run_id: str = Field(default="openrlhf", pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,40}$")
    rules: ConversionRules = Field(default_factory=ConversionRules)
    task_defaults: dict[str, Any] = Field(
        default_factory=dict, description="RolloutTask fields a label does not give"
    )
    group_linger_s: float = Field(
        default=5.0, gt=0, description="a group short of samples_per_prompt starts after this"
    )
    poll_s: float = Field(default=1.0, gt=0)


# ------------------------------------------------------------------------- grouping
class _Forming:
    """Calls of one prompt waiting to become one group."""

    def __init__(self, task: RolloutTask, prompt: Any, label: Any, placeholder: list[int]) -> None:
        self.task, self.prompt, self.label, self.placeholder = task, prompt, label, placeholder
        self.members = 0
        self.result: asyncio.Future[list[OpenRLHFResponse]] = (
            asyncio.get_running_loop().create_future()
        )
        self.timer: asyncio.TimerHandle | None = None


GroupRunner = Callable[[RolloutTask, int, Any, Any, list[int]], Awaitable[list[OpenRLHFResponse]]]


class GroupGate:
    """Joins OpenRLHF's concurrent `execute` calls for one prompt into one group.

    OpenRLHF starts the n calls of a prompt together (`asyncio.gather` in its rollout
    actor); each joins the forming group of its prompt+label, the n-th starts it. A group
    still short after `linger_s` starts with the calls it has (and warns): the settings'
    `samples_per_prompt` then disagrees with OpenRLHF's. A repeated prompt beyond n opens
    the next group.
    """

    def __init__(self, size: int, linger_s: float, run: GroupRunner) -> None:
        self.size, self.linger_s, self.run = size, linger_s, run
        self._forming: dict[str, _Forming] = {}
        self._running: set[asyncio.Task[None]] = set()

    async def join(
        self, key: str, task: RolloutTask, prompt: Any, label: Any, placeholder: list[int]
    ) -> OpenRLHFResponse:
        forming = self._forming.get(key)
        if forming is None:
            forming = self._forming[key] = _Forming(task, prompt, label, placeholder)
            forming.timer = asyncio.get_running_loop().call_later(
                self.linger_s, self._start, key, forming
            )
        index = forming.members
        forming.members += 1
        if forming.members == self.size:
            self._start(key, forming)
        return (await asyncio.shield(forming.result))[index]

    def _start(self, key: str, forming: _Forming) -> None:
        if self._forming.get(key) is not forming:
            return  # already started
        del self._forming[key]
        if forming.timer is not None:
            forming.timer.cancel()
        if forming.members < self.size:
            log.warning(
                "task %s: a group of %d started after %.1f s, %d expected "
                "(samples_per_prompt vs --rollout.n_samples_per_prompt)",
                forming.task.task_id,
                forming.members,
                self.linger_s,
                self.size,
            )
        job = asyncio.ensure_future(self._finish(forming))
        self._running.add(job)
        job.add_done_callback(self._running.discard)

    async def _finish(self, forming: _Forming) -> None:
        try:
            responses = await self.run(
                forming.task, forming.members, forming.prompt, forming.label, forming.placeholder
            )
        except BaseException as exc:  # every waiting call gets the error
            forming.result.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            forming.result.set_result(responses)


# ------------------------------------------------------------------ weight publishing
def newest_checkpoint(root: Path) -> tuple[int, Path] | None:
    """OpenRLHF's newest `global_step<N>_hf` directory under `root` (None: none yet)."""
    best: tuple[int, Path] | None = None
    if root.is_dir():
        for child in root.iterdir():
            match = _HF_CHECKPOINT.match(child.name)
            if match and (child / "config.json").exists():
                step = int(match.group(1))
                if best is None or step > best[0]:
                    best = (step, child)
    return best


# ------------------------------------------------------------------------- executor
class RolloutAgentExecutor:
    """OpenRLHF's agent executor, backed by our rollouts (see the module docstring).

    `make_agent_executor` mixes in OpenRLHF's `AgentExecutorBase`; the logic lives here so
    it is testable where OpenRLHF is not installed.
    """

    settings: OpenRLHFBridgeSettings

    def __init__(self, settings: OpenRLHFBridgeSettings | None = None) -> None:
        if settings is not None:
            self.settings = settings
        elif not hasattr(self, "settings"):
            self.settings = settings_from_env()
        self._gate = GroupGate(
            self.settings.samples_per_prompt, self.settings.group_linger_s, self._run_group
        )
        s = self.settings
        self._client: Any = None  # a connected client given instead (tests)
        self._connect = PerLoop(s.connect)
        self._published: int | None = None
        self._serial = 0

    async def execute(
        self,
        prompt: Any,
        label: Any,
        sampling_params: Any,
        max_length: int,
        hf_tokenizer: Any,
        llm_engine: Any,
        images: Any = None,
    ) -> OpenRLHFResponse:
        """One of OpenRLHF's n calls for this prompt: its sample of the prompt's group."""
        if images:
            raise BridgeInputError("images: multimodal prompts are not supported by this bridge")
        task = task_from_openrlhf(prompt, label, self.settings.task_defaults)
        placeholder = _tokenize(hf_tokenizer, task.prompt)
        key = hashlib.sha256(json.dumps([str(prompt), str(label)]).encode()).hexdigest()
        response = await self._gate.join(key, task, prompt, label, placeholder)
        if len(response["observation_tokens"]) > max_length:
            log.info(
                "task %s: a sample of %d tokens is clipped to --data.max_len %d by OpenRLHF",
                task.task_id,
                len(response["observation_tokens"]),
                max_length,
            )
        return response

    async def _policy(self) -> tuple[str | None, int | None]:
        """Publish a newer OpenRLHF checkpoint; the version the Gateway serves and its index."""
        s = self.settings
        if s.gateway is None:
            return None, s.rules.current_version
        policy = gateway_policy(s.gateway)
        if s.checkpoint_root is not None:
            found = newest_checkpoint(Path(s.checkpoint_root))
            if found is not None and (self._published is None or found[0] > self._published):
                step, path = found
                await publish(policy, f"{s.run_id}-v{step}", path)
                self._published = step
        version = await served_version(policy)
        if version is None:
            return None, s.rules.current_version
        return version, policy_version_index(version)

    async def _run_group(
        self, task: RolloutTask, size: int, prompt: Any, label: Any, placeholder: list[int]
    ) -> list[OpenRLHFResponse]:
        version, current = await self._policy()
        self._serial += 1
        got = await collect_groups(
            self._client or await self._connect.get(),
            [task],
            self.settings.output,
            size,
            batch_id=f"orl{os.getpid()}x{self._serial}{secrets.token_hex(3)}",
            rules=self.settings.rules.model_copy(update={"current_version": current}),
            policy_version=version,
            poll_s=self.settings.poll_s,
        )
        for o in got.outcomes:
            if not o.ok:
                log.warning(
                    "rollout %s: %s (%s): a fill sample stands in",
                    o.rollout_id,
                    o.workflow_status,
                    o.error,
                )
        group = next(iter(got.converted.groups), None) or TrainingGroup(
            group_id=next(iter(got.batch.groups)), task_id=task.task_id, rollouts=[]
        )
        return group_responses(group, size, prompt=prompt, label=label, placeholder_ids=placeholder)


def _tokenize(hf_tokenizer: Any, text: str) -> list[int]:
    """The task prompt's ids: a fill sample's observation (OpenRLHF needs one token)."""
    ids = hf_tokenizer(text=text, add_special_tokens=False)["input_ids"]
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(i) for i in ids] or [0]


def settings_from_env(env: Mapping[str, str] | None = None) -> OpenRLHFBridgeSettings:
    raw = (env if env is not None else os.environ).get(SETTINGS_ENV)
    if not raw:
        raise BridgeInputError(
            f"{SETTINGS_ENV}: not set; give the executor its settings "
            "(make_agent_executor(settings)) or set it to their JSON"
        )
    return OpenRLHFBridgeSettings.model_validate_json(raw)


def make_agent_executor(settings: OpenRLHFBridgeSettings | None = None) -> type:
    """The `AgentExecutor` class for the file `--train.agent_func_path` names:

        from bridges.openrlhf import OpenRLHFBridgeSettings, make_agent_executor
        settings = OpenRLHFBridgeSettings(output=..., samples_per_prompt=8)
        AgentExecutor = make_agent_executor(settings)

    A subclass of OpenRLHF's `AgentExecutorBase` (its loader checks that) with the settings
    bound, since OpenRLHF builds it with no arguments.
    """
    from openrlhf.utils.agent import AgentExecutorBase

    bound = settings if settings is not None else settings_from_env()

    class AgentExecutor(RolloutAgentExecutor, AgentExecutorBase):
        __doc__ = RolloutAgentExecutor.__doc__

        def __init__(self) -> None:
            RolloutAgentExecutor.__init__(self, bound)

    return AgentExecutor
