"""`python -m trainer CONFIG.json`: run (or resume) one training run.

The config is a `schemas.training.TrainConfig` as JSON; `rollout train` writes it.
"""

import asyncio
import sys
from pathlib import Path

from schemas.training import TrainConfig


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m trainer CONFIG.json", file=sys.stderr)
        return 2
    cfg = TrainConfig.model_validate_json(Path(argv[0]).read_text())
    if cfg.trainer == "trl":
        from trainer.trl_loop import run

        run(cfg)
        return 0
    from trainer.loop import Trainer

    asyncio.run(Trainer(cfg).run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
