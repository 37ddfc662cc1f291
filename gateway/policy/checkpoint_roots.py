"""Which checkpoint directories a policy update may name: only under the gateway's
`--checkpoint-root` directories.

Why: `POST /policy` makes this process read the directory's files and every engine load
them, so a path is a read of the host's files on the caller's word. A path is taken only
when it, and every file inside it, resolves (symlinks followed) under a root; with no
root configured no update is taken at all. Refusals name the roots, never whether a path
outside them exists.
"""

import os
from pathlib import Path

from gateway.errors import GatewayError

MAX_CHECKPOINT_FILES = 10_000
"""A checkpoint directory with more entries is refused (no walk of a whole tree)."""


def resolve_roots(roots: list[Path] | list[str]) -> list[Path]:
    return [Path(os.path.realpath(root)) for root in roots]


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def resolve_checkpoint(checkpoint: str, roots: list[Path]) -> Path:
    """The checkpoint's real path when it lies under a root; else a 403 (400 when not
    absolute, 404 when missing under a root)."""
    path = Path(checkpoint)
    if not path.is_absolute():
        raise GatewayError(
            "invalid_request", "checkpoint must be an absolute path", param="checkpoint"
        )
    shown = ", ".join(str(r) for r in roots)
    if not roots:
        raise GatewayError(
            "forbidden",
            "policy updates are off: this gateway has no checkpoint root "
            "(start it with --checkpoint-root DIR)",
            param="checkpoint",
        )
    real = Path(os.path.realpath(path))
    if not _under(real, roots):
        raise GatewayError(
            "forbidden",
            f"checkpoint {checkpoint} is not under a checkpoint root ({shown})",
            param="checkpoint",
        )
    if not real.is_dir():
        raise GatewayError("not_found", f"checkpoint {checkpoint} does not exist")
    for count, entry in enumerate(real.rglob("*")):
        if count >= MAX_CHECKPOINT_FILES:
            raise GatewayError(
                "invalid_request",
                f"checkpoint {checkpoint} holds over {MAX_CHECKPOINT_FILES} entries",
                param="checkpoint",
            )
        if not _under(Path(os.path.realpath(entry)), roots):
            raise GatewayError(
                "forbidden",
                f"checkpoint {checkpoint}: {entry.relative_to(real)} links outside the "
                f"checkpoint roots ({shown})",
                param="checkpoint",
            )
    return real
