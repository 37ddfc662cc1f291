"""Shared fixtures. Services are started once per test session and stopped at the end;
a missing service fails with install instructions rather than skipping."""

pytest_plugins = [
    "tests.setup_steps",
    "tests.fixtures.vllm",
    "tests.fixtures.gateway",
    "tests.fixtures.sandboxes",
    "tests.fixtures.temporal",
    "tests.fixtures.trainer",
    "tests.fixtures.real_batch",
]
