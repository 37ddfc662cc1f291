"""A session this process serves, in memory: its held segments and their scenes, its
counters, the answers a retry may get again and its converted history."""

import asyncio
import hashlib
from collections.abc import Callable

from gateway.capture.retries import RetryReplies
from gateway.capture.store import SegmentOpened, SessionMeta
from gateway.prompt.incremental import HeldSegment, PromptPlan
from gateway.protocols.history import HistoryCache
from gateway.protocols.opaque_token import TokenSeal
from schemas.scenes import Scene


class LiveSession:
    """In-memory state of a session owned by this process."""

    def __init__(self, meta: SessionMeta, now: float, seal: TokenSeal) -> None:
        self.meta = meta
        self.seal = seal
        """Mints and checks the opaque tokens of this session's replies."""
        self.held: list[HeldSegment] = []
        self.segment_scenes: dict[str, Scene] = {}
        self.last_call: dict[str, str] = {}
        self.calls = 0
        self.failed_calls = 0
        self.inflight = 0
        """Calls of this session running now (`limits.call_slot`)."""
        self.body_bytes = 0
        """Bytes of request body this session's calls are reading and parsing now
        (`limits.body_budget`)."""
        self.body_credit: tuple[float, float] | None = None
        """(bytes of body the session may still send, when that was so): its body-rate
        bucket (`limits.body_budget`); None: full."""
        self.limit_refusals: dict[str, int] = {}
        """Calls refused by a limit since this process took the session, by limit name;
        replaced, never changed in place, so a thread may read it (`refused`)."""
        self.replies = RetryReplies()
        self.history: HistoryCache | None = HistoryCache()
        """The request history already converted (None: convert every request in full)."""
        self.lock = asyncio.Lock()
        self.parse_lock = asyncio.Lock()
        """One parse at a time uses `history` (a long one runs in a thread)."""
        self.routing_from: dict[str, int] = {}
        """Per segment whose routing is recorded whole so far: its last call's prompt
        length, from where the next call asks for routing (`calls.routing`)."""
        self.routing_shape: tuple[int, int] | None = None
        """(MoE layers, top_k) of the session's first recorded routing, which every later
        call's must have (unless the gateway was given the model's)."""
        self.closed = False
        self.last_active = now  # wall clock, like created_at and file mtimes

    def refused(self, limit: str | None) -> None:
        """Count a call refused by `limit` (None: a refusal that is no limit's)."""
        if limit is not None:
            self.limit_refusals = {
                **self.limit_refusals,
                limit: self.limit_refusals.get(limit, 0) + 1,
            }

    def checkpoint(self, plan: PromptPlan) -> Callable[[], None]:
        """An undo for committing `plan`: drops the segments it adds and restores the one it
        extends, so a call whose record cannot be written leaves no trace in memory."""
        held, scenes = list(self.held), dict(self.segment_scenes)
        restore = plan.segment.checkpoint() if plan.segment is not None else None

        def undo() -> None:
            self.held[:] = held
            self.segment_scenes.clear()
            self.segment_scenes.update(scenes)
            if restore is not None:
                restore()

        return undo

    def _latest(self, *scenes: Scene) -> str | None:
        for segment_id, scene in reversed(self.segment_scenes.items()):
            if scene in scenes:
                return segment_id
        return None

    def open_segment(self, segment: HeldSegment, scene: Scene) -> SegmentOpened:
        """Place a new segment in the session's tree.

        A sub-agent's conversation is `spawned_by` the latest main segment; a compaction
        `continues` the main conversation it summarises, and the main conversation that
        resumes from the summary `continues` that compaction. Anything else keeps the
        parent the prefix matcher found (a fork of shared history), unlinked.
        """
        parent, link = segment.parent_id, None
        if scene is Scene.subagent:
            parent, link = self._latest(Scene.main) or parent, "spawned_by"
        elif scene is Scene.compaction:
            parent, link = self._latest(Scene.main) or parent, "continues"
        elif scene is Scene.main:
            latest = self._latest(Scene.main, Scene.compaction)
            if latest is not None and self.segment_scenes[latest] is Scene.compaction:
                parent, link = latest, "continues"
        if link is not None and parent is None:
            link = None
        self.segment_scenes[segment.segment_id] = scene
        return SegmentOpened(
            segment_id=segment.segment_id, parent_id=parent, link=link, scene=scene.value
        )


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
