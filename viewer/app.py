"""The viewer's web app: Batch, Rollout, Evaluation and Lineage pages, server-rendered.

Plain HTML with ordinary links and GET forms (every page has its own URL and reads with
JavaScript off); no script is served at all, and the Content-Security-Policy forbids
one, so recorded text (escaped by Jinja2's autoescape) can never run. A token, when
set, is taken once from `?token=` and kept in a cookie. Pages read files, so the
endpoints are plain functions (Starlette runs them on its thread pool).
"""

import hmac
import os
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pyarrow as pa
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from tokenizers import Tokenizer

from rollout_client.samples_reader import (
    ArtifactView,
    BatchView,
    NotFoundError,
    RolloutDetail,
    RolloutSummary,
    SamplesReader,
    SegmentView,
)
from schemas.samples import SampleRow, is_s3
from schemas.tasks import check_rollout_id
from viewer.conversation import PAGE_CALLS, conversation_page
from viewer.text import clip
from viewer.tokens import HEAT_BUCKETS, HEAT_STEP, PAGE_TOKENS, token_page

COOKIE = "rollout_view_token"
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
#: Characters of an artifact file (its tail) shown on its page, and of a log inline.
ARTIFACT_CHARS = 200_000
LOG_TAIL_CHARS = 4000
#: Artifact kinds the evaluation page does not show as logs.
_NOT_LOGS = {"diff", "evaluation", "metrics", "log_manifest"}
#: Reward histogram bins over [0, 1] (rewards outside widen the range).
REWARD_BINS = 10
#: Rollouts a batch page lists (the rest on further pages).
BATCH_ROWS = 200
_STATIC = Path(__file__).parent / "static"


def viewer_app(
    reader: SamplesReader,
    *,
    tokenizer: Tokenizer | None = None,
    token: str | None = None,
    allowed_hosts: list[str] | None = None,
) -> "_Guard":
    env = Environment(
        loader=PackageLoader("viewer", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    env.globals.update(
        clip=clip,
        page_tokens=PAGE_TOKENS,
        page_calls=PAGE_CALLS,
        heat_buckets=[(i, -(i + 1) * HEAT_STEP) for i in range(HEAT_BUCKETS)],
        location=reader.location,
    )

    def page(name: str, status_code: int = 200, **ctx: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(**ctx), status_code=status_code)

    def not_found(message: str) -> HTMLResponse:
        return page("error.jinja", 404, message=message)

    def index(request: Request) -> Response:
        ids = reader.batch_ids()
        if len(ids) == 1:
            return batch_view(request, None)
        return page("batches.jinja", batch_ids=ids)

    def batch_page(request: Request) -> Response:
        return batch_view(request, request.path_params["batch_id"])

    cache: dict[str | None, tuple[tuple[Any, ...], BatchView]] = {}

    def read_batch(batch_id: str | None) -> BatchView:
        """The batch, read again only when a file under the samples dir changed (local)."""
        key = _signature(reader.location)
        hit = cache.get(batch_id)
        if key is not None and hit is not None and hit[0] == key:
            return hit[1]
        batch = reader.batch(batch_id)
        if key is not None:
            cache[batch_id] = (key, batch)
        return batch

    def warm() -> None:
        """Read every batch once (a large batch's first read takes seconds)."""
        ids = reader.batch_ids()
        for batch_id in [None] if len(ids) == 1 else ids:
            read_batch(batch_id)

    def batch_view(request: Request, batch_id: str | None) -> Response:
        try:
            batch = read_batch(batch_id)
        except NotFoundError as exc:
            return not_found(str(exc))
        q = request.query_params
        shown = [s for s in batch.rollouts if _keep(s, q)]
        pages = max(1, -(-len(shown) // BATCH_ROWS))
        at = min(max(_int(q.get("page")), 0), pages - 1)
        here = {k: v for k, v in q.items() if k != "page"}
        return page(
            "batch.jinja",
            batch=batch,
            matching=len(shown),
            rollouts=shown[at * BATCH_ROWS : (at + 1) * BATCH_ROWS],
            page_no=at,
            pages=pages,
            page_url=lambda n: "?" + urlencode({**here, "page": n}),
            tasks=sorted({s.task_id for s in batch.rollouts}),
            statuses=sorted({s.status for s in batch.rollouts}),
            per_task=_per_task(batch.rollouts),
            q=q,
        )

    def detail_of(request: Request) -> RolloutDetail | HTMLResponse:
        rid = request.path_params["rollout_id"]
        try:
            check_rollout_id(rid)
            return reader.rollout(rid)
        except NotFoundError as exc:
            return not_found(str(exc))
        except (ValueError, OSError, pa.ArrowException) as exc:  # a bad id, a file unread
            return page("error.jinja", 404, message=f"{rid}: {exc}")

    def rollout_page(request: Request) -> Response:
        d = detail_of(request)
        if isinstance(d, Response):
            return d
        segs = d.segment_views
        wanted = request.query_params.get("segment")
        seg = next((g for g in segs if g.segment_id == wanted), segs[0] if segs else None)
        view = "conversation" if request.query_params.get("view") == "conversation" else "tokens"
        at = _int(request.query_params.get("page"))
        return page(
            "rollout.jinja",
            s=d,
            seg=seg,
            tree=_tree(segs),
            view=view,
            tokens=token_page(seg, at, tokenizer) if seg and view == "tokens" else None,
            conversation=conversation_page(seg, at) if seg and view != "tokens" else None,
            has_tokenizer=tokenizer is not None,
            page_url=lambda n: (
                "?" + urlencode({"segment": seg.segment_id, "view": view, "page": n})
            ),
        )

    def evaluation_page(request: Request) -> Response:
        d = detail_of(request)
        if isinstance(d, Response):
            return d
        diff = next((a for a in d.artifacts if a.kind == "diff"), None)
        logs = [a for a in d.artifacts if a.kind not in _NOT_LOGS]
        return page(
            "evaluation.jinja",
            s=d,
            artifacts_given=reader.artifacts is not None,
            diff=diff,
            diff_text=_artifact_text(diff, reader.artifacts) if diff else None,
            log_tails=[(a, _artifact_text(a, reader.artifacts, LOG_TAIL_CHARS)) for a in logs],
        )

    def lineage_page(request: Request) -> Response:
        d = detail_of(request)
        if isinstance(d, Response):
            return d
        rows = reader.rows(d.rollout_id) if d.samples_uri else []
        return page("lineage.jinja", s=d, rows=rows, fields=_lineage(rows))

    def artifact_page(request: Request) -> Response:
        d = detail_of(request)
        if isinstance(d, Response):
            return d
        name = request.path_params["name"]
        found = next((a for a in d.artifacts if a.name == name), None)
        if found is None:
            return not_found(f"no artifact {name!r} recorded for {d.rollout_id}")
        return page("artifact.jinja", s=d, a=found, text=_artifact_text(found, reader.artifacts))

    def css(_: Request) -> Response:
        return FileResponse(_STATIC / "viewer.css", media_type="text/css")

    routes = [
        Route("/", index),
        Route("/batch/{batch_id}", batch_page),
        Route("/rollout/{rollout_id}", rollout_page),
        Route("/rollout/{rollout_id}/evaluation", evaluation_page),
        Route("/rollout/{rollout_id}/lineage", lineage_page),
        Route("/rollout/{rollout_id}/artifact/{name:path}", artifact_page),
        Route("/static/viewer.css", css),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts or ["*"])]
    app = Starlette(routes=routes, middleware=middleware)
    return _Guard(app, token, warm)


class _Guard:
    """Security headers on every response; the token check when one is set. `warm()`
    reads the batches ahead of the first visit."""

    def __init__(self, app: ASGIApp, token: str | None, warm: Callable[[], None]) -> None:
        self.app, self.token, self.warm = app, token, warm

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


def _signature(location: str) -> tuple[Any, ...] | None:
    """Every file under a local samples dir (and its batch dirs) with its mtime and size;
    None for S3 (read each time)."""
    if is_s3(location):
        return None
    found = []
    todo = [location]
    for depth in range(2):
        subdirs = []
        for d in todo:
            with os.scandir(d) as it:
                for e in it:
                    if e.is_file():
                        st = e.stat()
                        found.append((e.path, st.st_mtime_ns, st.st_size))
                    elif e.is_dir() and depth == 0:
                        subdirs.append(e.path)
        todo = subdirs
    return tuple(sorted(found))


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


def _tree(segs: list[SegmentView]) -> list[tuple[int, SegmentView]]:
    """Segments in tree order with their depth (compaction continues, sub-agents spawn)."""
    children: dict[str | None, list[SegmentView]] = defaultdict(list)
    ids = {g.segment_id for g in segs}
    for g in segs:
        children[g.parent_segment_id if g.parent_segment_id in ids else None].append(g)
    out: list[tuple[int, SegmentView]] = []

    def walk(parent: str | None, depth: int) -> None:
        for g in children.get(parent, []):
            out.append((depth, g))
            walk(g.segment_id, depth + 1)

    walk(None, 0)
    return out


_TOKEN_FIELDS = {"prompt_ids", "response_ids", "loss_mask", "logprobs"}


def _lineage(rows: list[SampleRow]) -> list[tuple[str, list[str]]]:
    """Every field of every row but its tokens, one line per field."""
    out = []
    for name in (n for n in SampleRow.model_fields if n not in _TOKEN_FIELDS):
        values = []
        for r in rows:
            v = getattr(r, name)
            if name in ("call_policy_versions", "call_sampling"):
                v = ", ".join(f"{k} ×{c}" for k, c in Counter(v).items()) or "(as the row's)"
            elif name in ("eval_checks", "artifacts"):
                v = ", ".join(m.name for m in v)
            elif name == "routed_experts" and v is not None:  # its shape, not its bytes
                v = f"{v.tokens} tokens x {v.layers} layers x {v.top_k} experts, {v.dtype}"
            values.append("" if v is None else str(v))
        out.append((name, values))
    return out


def _artifact_text(a: ArtifactView, root: Path | None, limit: int = ARTIFACT_CHARS) -> str | None:
    """The tail of a present artifact (clipped), None when it is not readable here; a
    path outside the data dir given is never read."""
    if a.state != "present" or a.path is None or root is None:
        return None
    path = Path(a.path).resolve()
    if not path.is_relative_to(root.resolve()):
        return None
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - limit * 4))
            data = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    return clip(data, limit, keep="tail")
