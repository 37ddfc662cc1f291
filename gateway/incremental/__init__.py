"""Incremental tokenization with held tokens."""

from gateway.incremental.planner import *  # noqa: F403
from gateway.incremental.planner import __all__  # noqa: F401
