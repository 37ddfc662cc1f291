"""The viewer's web app: Batch, Rollout, Evaluation and Lineage pages, server-rendered.

Plain HTML with ordinary links and GET forms (every page has its own URL and reads with
JavaScript off); no script is served at all, and the Content-Security-Policy forbids
one, so recorded text (escaped by Jinja2's autoescape) can never run. A token, when
set, is taken once from `?token=` and kept in a cookie.
"""

import hmac
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from tokenizers import Tokenizer

from schemas.samples import SampleRow
from schemas.tasks import check_rollout_id
from viewer.samples_dir import Batch, RolloutSummary, SamplesDir
from viewer.text import clip
from viewer.tokens import HEAT_BUCKETS, HEAT_STEP, PAGE_TOKENS, token_page

COOKIE = "rollout_view_token"
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
#: Characters of an artifact file (its tail) shown on a page.
ARTIFACT_CHARS = 200_000
#: Reward histogram bins over [0, 1] (rewards outside widen the range).
REWARD_BINS = 10
_STATIC = Path(__file__).parent / "static"


def viewer_app(
    samples: SamplesDir,
    *,
    tokenizer: Tokenizer | None = None,
    token: str | None = None,
    allowed_hosts: list[str] | None = None,
) -> Starlette:
    env = Environment(
        loader=PackageLoader("viewer", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    env.globals.update(
        clip=clip,
        page_tokens=PAGE_TOKENS,
        heat_buckets=[(i, -(i + 1) * HEAT_STEP) for i in range(HEAT_BUCKETS)],
    )

    def page(name: str, status_code: int = 200, **ctx: Any) -> HTMLResponse:
        html = env.get_template(name).render(batch_path=samples.path, **ctx)
        return HTMLResponse(html, status_code=status_code)

    def summary_or_404(rollout_id: str) -> tuple[Batch, RolloutSummary] | HTMLResponse:
        try:
            check_rollout_id(rollout_id)
        except ValueError as exc:
            return page("error.jinja", 404, message=str(exc))
        batch = samples.batch()
        if rollout_id not in batch.rollouts:
            return page("error.jinja", 404, message=f"no rollout {rollout_id} in this batch")
        return batch, batch.rollouts[rollout_id]

    async def batch_page(request: Request) -> Response:
        batch = samples.batch()
        q = request.query_params
        shown = [s for s in batch.rollouts.values() if _keep(s, q)]
        return page(
            "batch.jinja",
            batch=batch,
            rollouts=shown,
            tasks=sorted({s.task_id for s in batch.rollouts.values()}),
            statuses=sorted({s.status for s in batch.rollouts.values()}),
            per_task=_per_task(list(batch.rollouts.values())),
            q=q,
        )

    async def rollout_page(request: Request) -> Response:
        got = summary_or_404(request.path_params["rollout_id"])
        if isinstance(got, Response):
            return got
        _, summary = got
        rows = samples.rows(summary.rollout_id) if summary.has_samples else []
        seg_id = request.query_params.get("segment")
        row = next((r for r in rows if r.segment_id == seg_id), rows[0] if rows else None)
        tokens = None
        if row is not None:
            tokens = token_page(row, _int(request.query_params.get("page")), tokenizer)
        return page(
            "rollout.jinja",
            s=summary,
            rows=rows,
            row=row,
            tree=_tree(rows),
            tokens=tokens,
            has_tokenizer=tokenizer is not None,
            page_url=lambda n: "?" + urlencode({"segment": row.segment_id, "page": n}),
        )

    async def evaluation_page(request: Request) -> Response:
        got = summary_or_404(request.path_params["rollout_id"])
        if isinstance(got, Response):
            return got
        _, summary = got
        rows = samples.rows(summary.rollout_id) if summary.has_samples else []
        attempt = samples.attempt_dir(summary.rollout_id)
        return page(
            "evaluation.jinja",
            s=summary,
            row=rows[0] if rows else None,
            labels=_labels(rows[0]) if rows else {},
            attempt=attempt,
            artifacts_given=samples.artifacts is not None,
            evaluation=_evaluation(attempt),
            diff=_read_tail(attempt / "diff.patch") if attempt else None,
            files=_files(attempt),
            log_tails=_log_tails(attempt),
        )

    async def lineage_page(request: Request) -> Response:
        got = summary_or_404(request.path_params["rollout_id"])
        if isinstance(got, Response):
            return got
        _, summary = got
        rows = samples.rows(summary.rollout_id) if summary.has_samples else []
        return page("lineage.jinja", s=summary, rows=rows, fields=_lineage(rows))

    async def artifact_page(request: Request) -> Response:
        got = summary_or_404(request.path_params["rollout_id"])
        if isinstance(got, Response):
            return got
        _, summary = got
        attempt = samples.attempt_dir(summary.rollout_id)
        rel = request.path_params["path"]
        file = (attempt / rel).resolve() if attempt else None
        if file is None or not file.is_relative_to(attempt.resolve()) or not file.is_file():
            return page("error.jinja", 404, message=f"artifact {rel!r}: missing")
        return page("artifact.jinja", s=summary, name=rel, text=_read_tail(file))

    async def css(_: Request) -> Response:
        return FileResponse(_STATIC / "viewer.css", media_type="text/css")

    routes = [
        Route("/", batch_page),
        Route("/rollout/{rollout_id}", rollout_page),
        Route("/rollout/{rollout_id}/evaluation", evaluation_page),
        Route("/rollout/{rollout_id}/lineage", lineage_page),
        Route("/rollout/{rollout_id}/artifact/{path:path}", artifact_page),
        Route("/static/viewer.css", css),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts or ["*"])]
    app = Starlette(routes=routes, middleware=middleware)
    return _Guard(app, token)  # type: ignore[return-value]


class _Guard:
    """Security headers on every response; the token check when one is set."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        if self.token is not None:
            given = request.query_params.get("token")
            if given is not None and hmac.compare_digest(given, self.token):
                rest = {k: v for k, v in request.query_params.items() if k != "token"}
                url = request.url.path + ("?" + urlencode(rest) if rest else "")
                reply: Response = RedirectResponse(url, status_code=303)
                reply.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
                await _secured(reply)(scope, receive, send)
                return
            cookie = request.cookies.get(COOKIE, "")
            if not hmac.compare_digest(cookie, self.token):
                reply = HTMLResponse(
                    "<!doctype html><title>rollout view</title><p>This viewer needs its "
                    "token: open the URL `rollout view` printed (it ends in ?token=…).</p>",
                    status_code=401,
                )
                await _secured(reply)(scope, receive, send)
                return

        async def send_secured(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"content-security-policy", CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_secured)


def _secured(reply: Response) -> Response:
    reply.headers["content-security-policy"] = CSP
    reply.headers["x-content-type-options"] = "nosniff"
    return reply


def _int(raw: str | None) -> int:
    try:
        return int(raw or 0)
    except ValueError:
        return 0


def _float(raw: str | None) -> float | None:
    try:
        return float(raw) if raw not in (None, "") else None
    except ValueError:
        return None


def _keep(s: RolloutSummary, q: Any) -> bool:
    """The batch page's filters: status, task, reward range."""
    if q.get("status") and s.status != q["status"]:
        return False
    if q.get("task") and s.task_id != q["task"]:
        return False
    lo, hi = _float(q.get("min_reward")), _float(q.get("max_reward"))
    if lo is not None and (s.reward is None or s.reward < lo):
        return False
    return not (hi is not None and (s.reward is None or s.reward > hi))


def _per_task(rollouts: list[RolloutSummary]) -> list[dict[str, Any]]:
    """Per task: status counts and a reward histogram (REWARD_BINS bins)."""
    rewards = [s.reward for s in rollouts if s.reward is not None]
    lo, hi = min([0.0, *rewards]), max([1.0, *rewards])
    width = (hi - lo) / REWARD_BINS
    by_task: dict[str, list[RolloutSummary]] = defaultdict(list)
    for s in rollouts:
        by_task[s.task_id].append(s)
    out = []
    for task, items in sorted(by_task.items()):
        bins = [0] * REWARD_BINS
        for s in items:
            if s.reward is not None:
                bins[min(REWARD_BINS - 1, int((s.reward - lo) / width))] += 1
        out.append(
            {
                "task": task,
                "n": len(items),
                "statuses": sorted(Counter(s.status for s in items).items()),
                "bins": [
                    (lo + i * width, lo + (i + 1) * width, count) for i, count in enumerate(bins)
                ],
                "no_reward": sum(s.reward is None for s in items),
            }
        )
    return out


def _tree(rows: list[SampleRow]) -> list[tuple[int, SampleRow]]:
    """Segments in tree order with their depth (compaction continues, sub-agents spawn)."""
    children: dict[str | None, list[SampleRow]] = defaultdict(list)
    ids = {r.segment_id for r in rows}
    for r in rows:
        children[r.parent_segment_id if r.parent_segment_id in ids else None].append(r)
    out: list[tuple[int, SampleRow]] = []

    def walk(parent: str | None, depth: int) -> None:
        for r in children.get(parent, []):
            out.append((depth, r))
            walk(r.segment_id, depth + 1)

    walk(None, 0)
    return out


def _labels(row: SampleRow) -> dict[str, dict[str, Any]]:
    return {
        "verdict sources": json.loads(row.verdict_sources),
        "reward metrics": json.loads(row.reward_metrics),
        "sandbox facts": json.loads(row.sandbox_facts),
    }


_TOKEN_FIELDS = {"prompt_ids", "response_ids", "loss_mask", "logprobs"}


def _lineage(rows: list[SampleRow]) -> list[tuple[str, list[str]]]:
    """Every field of every row but its tokens, one line per field."""
    names = [n for n in SampleRow.model_fields if n not in _TOKEN_FIELDS]
    out = []
    for name in names:
        values = []
        for r in rows:
            v = getattr(r, name)
            if name in ("call_policy_versions", "call_sampling"):
                counts = Counter(v)
                v = ", ".join(f"{k} ×{c}" for k, c in counts.items()) or "(as the row's)"
            values.append("" if v is None else str(v))
        out.append((name, values))
    return out


def _evaluation(attempt: Path | None) -> dict[str, Any] | str | None:
    """evaluation.json as a dict; "missing" when the worker wrote none; None: no dir."""
    if attempt is None:
        return None
    try:
        value = json.loads((attempt / "evaluation.json").read_text())
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError) as exc:
        return f"unreadable: {exc}"
    return value if isinstance(value, dict) else "unreadable: not a JSON object"


def _read_tail(path: Path) -> str | None:
    """The tail of a text file (clipped), or None when it is not there."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - ARTIFACT_CHARS * 4))
            data = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    return clip(data, ARTIFACT_CHARS, keep="tail")


def _files(attempt: Path | None) -> list[tuple[str, int]]:
    if attempt is None:
        return []
    return sorted(
        (str(p.relative_to(attempt)), p.stat().st_size)
        for p in attempt.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(attempt).parts)
    )


def _log_tails(attempt: Path | None, limit: int = 4000) -> list[tuple[str, str]]:
    if attempt is None or not (attempt / "logs").is_dir():
        return []
    out = []
    for p in sorted((attempt / "logs").rglob("*"))[:20]:
        if p.is_file():
            out.append((str(p.relative_to(attempt)), clip(_read_tail(p) or "", limit, keep="tail")))
    return out
