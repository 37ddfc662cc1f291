"""A serving gateway or worker process runs the collector rarely and never over its start-up
objects (`workers.gc_policy`); checked in a fresh interpreter so this test process keeps
CPython's defaults."""

import json
import subprocess
import sys

from workers.gc_policy import SERVING_THRESHOLDS

PROBE = """
import gc, json
from workers.gc_policy import tune_gc_for_serving
tune_gc_for_serving()
print(json.dumps({"after": gc.get_threshold(),
                  "frozen": gc.get_freeze_count()}))
"""


def test_serving_policy_raises_the_thresholds_and_freezes_what_start_up_built() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    state = json.loads(out)
    assert tuple(state["after"]) == SERVING_THRESHOLDS
    assert state["frozen"] > 1000  # the modules imported so far are out of its reach
