"""`rollout show` in the terminal: a batch or one rollout, as the samples reader gives it.

Everything a rollout recorded is the agent's or a verifier's text, so none of it reaches
the terminal as it is: control characters (escape sequences, carriage returns) are
shown as `\\xNN`, every line is clipped, a long text keeps its tail, and text is never
read as rich markup (`safe`).
"""

import statistics
import unicodedata

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from rollout_client.samples_reader import BatchView, RolloutDetail, RolloutSummary
from schemas.conversation import CallConversation

#: How much of one line, and how many lines of a detail, the terminal shows.
LINE_CHARS = 240
DETAIL_LINES = 20
#: Characters of a call's reply the calls table shows.
REPLY_CHARS = 60
#: What the batch view lists.
SLOWEST = 5
ERROR_IDS = 5

_WHOSE = {
    "": "",
    "agent": "the agent's doing (trained on, reward 0)",
    "evaluator": "the evaluator's failure (ours: masked, no reward)",
    "infrastructure": "an infrastructure failure (ours: masked, no reward)",
}
_STATUS_STYLE = {"ok": "green", "truncated": "yellow"}


def safe(text: str, line_chars: int = LINE_CHARS) -> str:
    """One line of recorded text, fit for a terminal: control and format characters
    shown as escapes, clipped to `line_chars` with what was left out counted."""
    out = "".join(
        ch if ch == "\t" or unicodedata.category(ch) not in ("Cc", "Cf") else f"\\x{ord(ch):02x}"
        for ch in text
    )
    if len(out) > line_chars:
        out = f"{out[:line_chars]}… (+{len(out) - line_chars} chars)"
    return out


def safe_lines(text: str, lines: int = DETAIL_LINES) -> list[str]:
    """The last `lines` lines of a recorded text, each made `safe`."""
    all_lines = text.splitlines() or [""]
    kept = [safe(ln) for ln in all_lines[-lines:]]
    if len(all_lines) > lines:
        kept.insert(0, f"… ({len(all_lines) - lines} earlier lines)")
    return kept


def _t(text: str, style: str = "") -> Text:
    return Text(safe(text), style=style)


def _seconds(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def _reward(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _status(r: RolloutSummary) -> Text:
    return _t(r.status, _STATUS_STYLE.get(r.status, "red"))


def _duration(r: RolloutSummary) -> float | None:
    if r.duration_s is not None:
        return r.duration_s
    return sum(r.step_durations.values()) if r.step_durations else None


def _field(grid: Table, name: str, *values: RenderableType | str) -> None:
    grid.add_row(Text(name, style="bold"), *[_t(v) if isinstance(v, str) else v for v in values])


def _grid() -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    return grid


# ----------------------------------------------------------------------------- rollout


def rollout_view(r: RolloutDetail) -> RenderableType:
    """One rollout: status and whose, evaluation checks with detail tails, reward and
    metrics, step durations, calls, artifacts, lineage, and what its schema lacks."""
    head = _grid()
    title = (
        f"rollout {r.rollout_id} · batch {r.batch_id or '?'} · task {r.task_id} #{r.sample_index}"
    )
    status = Text.assemble(_status(r), (f"  {_WHOSE.get(r.whose, r.whose)}", "dim"))
    if not r.status_recorded:
        status.append(f"  (not recorded by schema v{r.schema_version}: from its rows)", "yellow")
    _field(head, "status", status)
    if r.reason:
        _field(head, "reason", Text("\n".join(safe_lines(r.reason))))
    metrics = ", ".join(f"{k}={v:g}" for k, v in sorted(r.reward_metrics.items()))
    _field(head, "reward", f"{_reward(r.reward)}" + (f"   metrics: {metrics}" if metrics else ""))
    _field(head, "verdict", r.verdict or "-")
    steps = " · ".join(f"{k} {v:.2f} s" for k, v in r.step_durations.items())
    _field(head, "steps", steps or "-")
    _field(head, "total", _seconds(r.duration_s))
    parts: list[RenderableType] = [Text(safe(title), style="bold"), head]
    parts.append(_checks(r))
    if r.segment_views:
        parts.append(_calls(r))
    else:
        parts.append(Text(f"calls: {r.calls} (no samples here)", style="dim"))
    parts.append(_artifacts(r))
    parts.append(_lineage(r))
    if r.missing:
        parts.append(
            _t(f"schema v{r.schema_version} does not record: {', '.join(r.missing)}", "yellow")
        )
    return Group(*parts)


def _checks(r: RolloutDetail) -> RenderableType:
    if not r.checks:
        return Text("evaluation: no checks recorded", style="dim")
    table = Table(title="evaluation", title_justify="left", show_lines=True, expand=False)
    for name in ("check", "result", "score", "exit", "time", "detail (tail)"):
        table.add_column(name, overflow="fold")
    for c in r.checks:
        result = "timed out" if c.timed_out else ("pass" if c.passed else "fail")
        table.add_row(
            Text(
                "\n".join(
                    safe(x)
                    for x in (f"{c.name} ({c.kind})", c.source and f"verdict from {c.source}")
                    if x
                )
            ),
            _t(result, "green" if c.passed else "red"),
            f"{c.score:g}",
            "-" if c.exit_code is None else str(c.exit_code),
            _seconds(c.duration_s),
            Text("\n".join(safe_lines(c.detail))),
        )
    return table


def _calls(r: RolloutDetail) -> RenderableType:
    table = Table(title="calls", title_justify="left")
    names = ("segment", "scene", "status", "call", "policy version", "tokens", "trained", "reply")
    for name in names:
        table.add_column(name, justify="right" if name in ("call", "tokens", "trained") else "left")
    for seg in r.segment_views:
        for call in seg.calls:
            table.add_row(
                _t(seg.segment_id),
                _t(seg.scene),
                _t(seg.status),
                str(call.index),
                _t(call.policy_version),
                str(call.tokens),
                str(call.trained_tokens),
                Text(safe(reply_brief(call.conversation), REPLY_CHARS)),
            )
    table.caption = (
        f"{r.segments} segment(s), {r.calls} call(s): {r.prompt_tokens} prompt, "
        f"{r.response_tokens} response, {r.trained_tokens} trained tokens"
    )
    return table


def reply_brief(said: CallConversation | None) -> str:
    """A call's reply in one line: its text, then its tool calls by name and arguments."""
    if said is None:
        return ""
    if said.reply is None:
        return "(no reply)"
    calls = [f"{c.name}({' '.join(c.arguments.split())})" for c in said.reply.tool_calls]
    text = " ".join((said.reply.content or "").split())
    return " ".join([text, *calls]).strip()


def _artifacts(r: RolloutDetail) -> RenderableType:
    grid = _grid()
    _field(grid, "artifacts", f"on the worker: {r.artifacts_dir or '-'}")
    for a in r.artifacts:
        state = {"present": "green", "missing": "red", "remote": "", "not looked": "dim"}[a.state]
        where = a.path if a.path else a.location
        _field(
            grid,
            "",
            Text.assemble(_t(f"{a.name} ({a.kind}) "), _t(a.state, state), "  ", _t(where)),
        )
    if any(a.state == "not looked" for a in r.artifacts):
        _field(grid, "", _t("give --artifacts WORKER_DATA_DIR to look them up", "dim"))
    return grid


def _lineage(r: RolloutDetail) -> RenderableType:
    grid = _grid()
    _field(grid, "harness", f"{r.harness} {r.harness_version}".strip() or "-")
    _field(grid, "policy", ", ".join(r.policy_versions) or "-")
    _field(grid, "task", r.task_source or "-")
    _field(grid, "env", f"{r.env_version or '-'}  image {r.image_digest or '-'}")
    _field(grid, "reward fn", r.reward_fn_version or "-")
    if r.sandbox_facts:
        _field(grid, "sandbox", ", ".join(f"{k}: {v}" for k, v in r.sandbox_facts.items()))
    _field(grid, "samples", f"{r.samples_uri or 'none'} (schema v{r.schema_version or '-'})")
    return grid


# ----------------------------------------------------------------------------- batch


def batch_view(b: BatchView, rollout_cmd: str | None = None) -> RenderableType:
    """A batch: status counts, reward by task, the slowest rollouts, and every error
    grouped by its first line."""
    parts: list[RenderableType] = [
        _t(f"batch {b.batch_id} · {len(b.rollouts)} rollout(s) · {b.location}", "bold")
    ]
    statuses = Table(title="statuses", title_justify="left")
    for name in ("status", "rollouts", "whose"):
        statuses.add_column(name)
    whose = {r.status: r.whose for r in b.rollouts}
    for status, n in b.status_counts().items():
        statuses.add_row(
            _t(status, _STATUS_STYLE.get(status, "red")),
            str(n),
            _t(_WHOSE.get(whose[status], whose[status])),
        )
    parts.append(statuses)
    rewards = Table(title="reward by task", title_justify="left")
    for name in ("task", "rewarded", "mean", "min", "max"):
        rewards.add_column(name, justify="left" if name == "task" else "right")
    for task, values in b.rewards_by_task().items():
        rewards.add_row(
            _t(task),
            str(len(values)),
            f"{statistics.fmean(values):.3f}",
            f"{min(values):.3f}",
            f"{max(values):.3f}",
        )
    parts.append(rewards)
    slow = Table(title="slowest", title_justify="left")
    for name in ("rollout", "task", "status", "duration", "slowest step"):
        slow.add_column(name)
    for r in b.slowest(SLOWEST):
        step = max(r.step_durations.items(), key=lambda kv: kv[1], default=None)
        slow.add_row(
            _t(r.rollout_id),
            _t(r.task_id),
            _status(r),
            _seconds(_duration(r)),
            _t(f"{step[0]} {step[1]:.2f} s") if step else "-",
        )
    parts.append(slow)
    errors = b.errors()
    if errors:
        table = Table(title="errors, by first line", title_justify="left")
        for name in ("rollouts", "first line", "e.g."):
            table.add_column(name, overflow="fold")
        for line, rollouts in errors.items():
            ids = ", ".join(r.rollout_id for r in rollouts[:ERROR_IDS])
            more = f" (+{len(rollouts) - ERROR_IDS})" if len(rollouts) > ERROR_IDS else ""
            table.add_row(str(len(rollouts)), _t(line), _t(ids + more))
        parts.append(table)
    else:
        parts.append(Text("no errors", style="green"))
    for path, why in b.unreadable.items():
        parts.append(_t(f"unreadable: {path}: {why}", "red"))
    if rollout_cmd:
        parts.append(_t(rollout_cmd, "dim"))
    return Group(*parts)


def print_view(console: Console, view: RenderableType) -> None:
    console.print(view, soft_wrap=False, highlight=False)
