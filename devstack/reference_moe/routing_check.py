"""Run ``recompute_routing.py`` in the vLLM CPU venv over stored sequences (main env side).

The main environment has no torch; the check needs transformers, so it runs as a
subprocess of the venv's interpreter, fed and read as JSON.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from pydantic import BaseModel, Field

from environments.vllm_cpu import ensure_vllm_venv, venv_environment, venv_python

SCRIPT = Path(__file__).with_name("recompute_routing.py")


class RoutedSequence(BaseModel):
    """One stored sequence and the routing recorded for it.

    `routed_experts` is vLLM's encoding (base64 `.npy`, (rows, layers, top_k)); row r is
    the routing of `token_ids[first_token + r]`."""

    name: str
    token_ids: list[int]
    routed_experts: str
    first_token: int = Field(default=0, ge=0)


class Agreement(BaseModel):
    """Of the (token, layer) choices: how many agree, were compared, or were ties."""

    agree: int = 0
    compared: int = 0
    ties: int = 0

    def __add__(self, other: Agreement) -> Agreement:
        return Agreement(
            agree=self.agree + other.agree,
            compared=self.compared + other.compared,
            ties=self.ties + other.ties,
        )


class RoutingReport(BaseModel):
    sequences: dict[str, list[Agreement]] = Field(description="per sequence, per MoE layer")
    mismatches: list[dict[str, object]] = Field(description="the first few, for a reader")

    def layers(self) -> list[Agreement]:
        """Per MoE layer, over every sequence."""
        per_layer = list(zip(*self.sequences.values(), strict=True))
        return [sum(counts, Agreement()) for counts in per_layer]

    def total(self, name: str | None = None) -> Agreement:
        """Over every layer of sequence `name` (None: of every sequence)."""
        rows = [self.sequences[name]] if name is not None else self.sequences.values()
        return sum((c for layers in rows for c in layers), Agreement())


def recompute_routing(
    model: Path | str,
    sequences: list[RoutedSequence],
    *,
    python: Path | None = None,
    options: dict[str, object] | None = None,
    timeout_s: float = 600.0,
) -> RoutingReport:
    """Per-layer agreement of the stored routing with a fresh transformers forward.

    `model`: a model directory or Hugging Face id; `python`: an interpreter with torch and
    transformers (default: the vLLM CPU venv's); `options`: the script's `dtype`,
    `device_map` and `tie_tolerance`."""
    body = {
        "model_dir": str(model),
        "sequences": [s.model_dump() for s in sequences],
        **(options or {}),
    }
    env = venv_environment()
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run(
        [str(python or venv_python(ensure_vllm_venv())), str(SCRIPT)],
        input=json.dumps(body).encode(),
        capture_output=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"routing recomputation failed: {done.stderr.decode()[-2000:]}")
    return RoutingReport.model_validate_json(done.stdout)
