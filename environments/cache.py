"""Where the project keeps what is slow to build on a host (environments, models, images)."""

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$ROLLOUT_CACHE_DIR`` or ``~/.cache/agentic-rollout``: where slow builds are kept."""
    env = os.environ.get("ROLLOUT_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "agentic-rollout"
