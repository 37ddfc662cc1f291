"""Error helpers shared by the activities.

Why: the workflow decides between "fail the rollout now" and "try a fresh attempt" by
the error *type*; only errors raised through these helpers are non-retryable, so a bad
task fails fast and visibly, and every other error gets the normal retry path.
"""

from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from schemas.rollout import AGENT_CONFIG_ERROR, BAD_TASK_SPEC


def _first_error(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        return f"{where}: {err.get('msg')}" if where else str(err.get("msg"))
    return str(exc) or type(exc).__name__


def bad_task(what: str, exc: BaseException | None = None) -> ApplicationError:
    """The task itself is wrong (spec, unknown backend/harness/hook): never retried."""
    detail = f"{what}: {_first_error(exc)}" if exc is not None else what
    return ApplicationError(detail, type=BAD_TASK_SPEC, non_retryable=True)


def agent_config_error(what: str, exc: BaseException | None = None) -> ApplicationError:
    """The agent cannot be started as configured (binary missing, bad config)."""
    detail = f"{what}: {_first_error(exc)}" if exc is not None else what
    return ApplicationError(detail, type=AGENT_CONFIG_ERROR, non_retryable=True)


def tail(text: str, limit: int = 2000) -> str:
    """Keep results small: history is not a log store."""
    return text if len(text) <= limit else "…" + text[-limit:]
