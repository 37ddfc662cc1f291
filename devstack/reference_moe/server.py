"""Start the STAND-IN MoE engine (``engine_server.py``) in the vLLM CPU venv.

The same process handling as the real vLLM launcher (own process group, tethered to the
starter, ``/health`` polled, SIGTERM then SIGKILL on stop); only the command differs.
"""

from __future__ import annotations

from pathlib import Path

from devstack.vllm_server import VllmServer

from .model import SERVED_MODEL_NAME

SCRIPT = Path(__file__).with_name("engine_server.py")


class ReferenceMoeServer(VllmServer):
    """``with ReferenceMoeServer(model_dir=ensure_moe_model()) as engine: engine.url``."""

    def __init__(self, model_dir: Path, max_model_len: int = 4096, **kwargs: object) -> None:
        kwargs.setdefault("served_model_name", SERVED_MODEL_NAME)
        kwargs.setdefault("startup_timeout_s", 180.0)
        super().__init__(model_dir=model_dir, max_model_len=max_model_len, **kwargs)

    def command(self, python: Path) -> list[str]:
        cfg = self.config
        return [
            str(python),
            str(SCRIPT),
            str(cfg.model_dir),
            "--host",
            cfg.host,
            "--port",
            str(self.port),
            "--served-model-name",
            cfg.served_model_name,
            "--max-model-len",
            str(cfg.max_model_len),
        ]
