"""The GRPO loop: a plain client of the service that learns from its samples.

Per step k (policy v(k−1) serving):
1. submit `tasks × group_size` rollouts (and the held-out tasks) with
   `policy_version = v(k−1)`, through Temporal, and consume results as they finish;
2. load their Parquet samples, prepare the batch (staleness, infra errors, advantages);
3. measure train–inference agreement on the untouched weights;
4. `updates_per_step` optimiser steps on the clipped loss;
5. save `policies/vk`, publish it (the Gateway's `POST /policy`: it pauses new engine
   calls, drains the running ones, has every engine load vk and resumes; or, without a
   gateway, load it into the engines directly), append the metrics, then record the
   step as complete in `state.json` (written last: a rerun resumes from the last
   complete policy and resubmits the same batch ids, so finished rollouts are reused).

With `overlap` (one-step off-policy, the default) step k+1's rollouts are submitted,
labelled with the policy then serving, before step k trains; they keep running while it
trains and while the new weights load (their calls wait at the Gateway meanwhile), so
step k+1 trains on samples up to one version old. Each call records the version that
sampled it, so `max_staleness` applies per call, and agreement is measured against the
weights that sampled each token; the importance ratio against the weights about to be
trained.

Layout of OUT: `policies/<run>-vN/`, `samples/step-000N/` (step N's rollouts),
`samples/heldout-000N/` (held-out rollouts of the policy that sampled step N; N = steps+1
is the final policy's), `trainer_state/` (optimiser state), `metrics.jsonl`,
`final_heldout.json`, `reward_curve.png`, `state.json`, `train_config.json`.
"""

import asyncio
import hashlib
import json
import os
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bridges.policy import publish
from gateway.engines.vllm_weights import VllmWeightLoader
from rollout_client import Batch, GatewayPolicyClient, RolloutClient, RolloutOutcome
from schemas.policy import PolicyUpdateRecord, WeightUpdate
from schemas.tasks import RolloutTask, load_tasks
from schemas.training import (
    FinalEval,
    StepMetrics,
    TrainConfig,
    policy_version_name,
    run_id_for,
)
from trainer.batch import TrainRow, prepare_batch, tasks_for_step
from trainer.heldout import collect, mean_reward, rewards, run_seed, submit_heldout, versioned
from trainer.loss import agreement, batch_loss
from trainer.policy import load_policy, save_policy
from trainer.report import fmt, plot_curve, read_metrics, step_line, write_metrics

STATE_FILE = "state.json"
FINAL_FILE = "final_heldout.json"


def log(msg: str) -> None:
    print(msg, flush=True)


class RunState:
    """`state.json`: the run id and the last complete step (0 = only v0 exists)."""

    def __init__(self, out: Path, run_id: str, step: int) -> None:
        self.out, self.run_id, self.step = out, run_id, step

    @classmethod
    def load_or_create(cls, out: Path, run_id: str | None) -> "RunState":
        path = out / STATE_FILE
        if path.exists():
            data = json.loads(path.read_text())
            return cls(out, data["run_id"], int(data["step"]))
        if run_id is None:
            seed = f"{out.resolve()}:{time.time_ns()}".encode()
            run_id = run_id_for(out.name, hashlib.sha256(seed).hexdigest()[:6])
        return cls(out, run_id, -1)

    def save(self) -> None:
        path = self.out / STATE_FILE
        tmp = self.out / f".{STATE_FILE}.tmp"
        with open(tmp, "w") as fh:
            json.dump({"run_id": self.run_id, "step": self.step}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)


class Trainer:
    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out).resolve()
        self.policies = self.out / "policies"
        self.samples = self.out / "samples"
        self.tasks = load_tasks(cfg.tasks)
        self.heldout = load_tasks(cfg.heldout) if cfg.heldout else []
        self.engines = [VllmWeightLoader(url) for url in cfg.engines]
        self.gateway = (
            GatewayPolicyClient(cfg.gateway, os.environ.get("ROLLOUT_ADMIN_TOKEN"))
            if cfg.gateway
            else None
        )
        self.last_publish: PolicyUpdateRecord | None = None
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
        self.model: torch.nn.Module
        self.run_id = ""
        self.version = ""
        self._behaviour: tuple[str, torch.nn.Module] | None = None

    # ------------------------------------------------------------------ setup
    def vname(self, index: int) -> str:
        return policy_version_name(self.run_id, index)

    def _opt_path(self, step: int) -> Path:
        return self.out / "trainer_state" / f"{self.vname(step)}.pt"

    def _start(self, state: RunState) -> None:
        """Load the last complete policy (creating v0 from the initial one on a first run)."""
        self.run_id = state.run_id
        if state.step < 0:
            model = load_policy(Path(self.cfg.init_policy))
            v0 = self.vname(0)
            save_policy(
                model,
                Path(self.cfg.init_policy),
                self.policies / v0,
                {"policy_version": v0, "step": 0, "parent": str(self.cfg.init_policy)},
            )
            state.step = 0
            self.model = model
            self.version = v0
            self.optimizer = self._optimizer()
            self._save_optimizer(0)
            write_metrics(self.out, [])
            state.save()
            return
        self.version = self.vname(state.step)
        self.model = load_policy(self.policies / self.version)
        self.optimizer = self._optimizer()
        opt_path = self._opt_path(state.step)
        if opt_path.exists():
            self.optimizer.load_state_dict(torch.load(opt_path, weights_only=True))
        kept = [m for m in read_metrics(self.out) if m.step <= state.step]
        write_metrics(self.out, kept)
        log(f"resumed: {self.out} at policy {self.version}")

    def _optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            self.model.parameters(), lr=self.cfg.lr, eps=self.cfg.adam_eps, weight_decay=0.0
        )

    def _save_optimizer(self, step: int) -> None:
        path = self._opt_path(step)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(self.optimizer.state_dict(), tmp)
        tmp.replace(path)

    async def _publish(self, step: int) -> float:
        """Policy v`step` to every engine: through the Gateway's policy update, or loaded
        into each engine directly (skipped where it already serves it)."""
        version = self.vname(step)
        checkpoint = str(self.policies / version)
        started = time.monotonic()
        self.last_publish = None
        if self.gateway is not None:
            done = await publish(self.gateway, version, checkpoint, unless_served=True)
            if done is not None:
                self.last_publish = done
                log(
                    f"  gateway: {version} loaded in {done.total_s:.2f}s (drain "
                    f"{done.drain_s:.2f}s, {done.drained_calls} calls drained, "
                    f"{done.held_calls} held)"
                )
            return time.monotonic() - started
        update = WeightUpdate(policy_version=version, checkpoint=checkpoint)
        for engine in self.engines:
            if await engine.current_version() == version:
                continue
            report = await engine.load(update)
            log(f"  engine {report.engine}: {version} loaded in {report.total_s:.2f}s")
        return time.monotonic() - started

    # ------------------------------------------------------------------ one step
    def _versioned(self, tasks: list[RolloutTask], version: str) -> list[RolloutTask]:
        return versioned(tasks, version)

    async def _collect(self, client: RolloutClient, batch: Batch) -> list[RolloutOutcome]:
        return await collect(client, batch)

    async def _submit(
        self, client: RolloutClient, state: RunState, step: int, label: str, train: bool = True
    ) -> "asyncio.Future[Rollouts]":
        """Start step `step`'s rollouts (and held-out) labelled with the served version
        `label`; returns a future of their results. The label is in the batch id, so a
        rerun that serves the same version reuses the rollouts already run."""
        started = time.monotonic()
        batch: Batch | None = None
        if train:
            batch = await client.submit(
                self._versioned(tasks_for_step(self.tasks, step, self.cfg.tasks_per_step), label),
                str(self.samples / f"step-{step:04d}"),
                samples_per_task=self.cfg.group_size,
                batch_id=f"{label}-s{step}",
                seed=run_seed(self.cfg.seed) + step,
                rerun_failed=True,
            )
        held: Batch | None = None
        if self.heldout and (not train or self.cfg.heldout_due(step)):
            held = await submit_heldout(
                client,
                self.heldout,
                label,
                self.samples,
                step,
                self.cfg.heldout_samples,
                self.cfg.seed,
            )

        async def gather() -> Rollouts:
            done, held_done = await asyncio.gather(
                self._collect(client, batch) if batch is not None else _nothing(),
                self._collect(client, held) if held is not None else _nothing(),
            )
            return Rollouts(
                label=label,
                outcomes=done,
                heldout=held_done,
                started=started,
                finished=time.monotonic(),
            )

        return asyncio.ensure_future(gather())

    def _model_for(self, version: str) -> torch.nn.Module:
        """The weights that sampled `version`: ours, or a saved policy (kept one at a time)."""
        if version == self.version:
            return self.model
        if self._behaviour is None or self._behaviour[0] != version:
            self._behaviour = (version, load_policy(self.policies / version).eval())
        return self._behaviour[1]

    def _train(self, rows: list[TrainRow]) -> tuple[float, float, float]:
        """`updates_per_step` optimiser steps; returns (last loss, clip fraction, grad norm)."""
        loss_v, clip_v, grad_v = 0.0, 0.0, 0.0
        if not rows:
            return loss_v, clip_v, grad_v
        self.model.train()
        for _ in range(self.cfg.updates_per_step):
            self.optimizer.zero_grad(set_to_none=True)
            loss, stats = batch_loss(self.model, rows, self.cfg.clip_low, self.cfg.clip_high)
            loss.backward()
            grad = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
            self.optimizer.step()
            loss_v, clip_v, grad_v = stats.loss, stats.clip_fraction, float(grad)
        return loss_v, clip_v, grad_v

    def _learn(self, step: int, ro: "Rollouts") -> dict[str, object]:
        """Blocking part of a step (runs in a thread so the next rollouts keep flowing):
        load samples, agreement, optimiser steps, save the new policy."""
        table = RolloutClient.load_samples(ro.outcomes)
        batch = prepare_batch(table.to_pylist(), step - 1, self.cfg.max_staleness, self.cfg.stale)
        trained = batch.trained
        self.model.eval()
        # Agreement compares each token with the weights that sampled it: through the
        # Gateway every call records its version; engines loaded directly leave the
        # label as the only hint, so the older policy and ours are both candidates.
        # The ratio is against the current weights.
        if self.gateway is not None:
            older = {
                version
                for row in trained
                for version, bit in zip(row.token_versions, row.loss_mask, strict=True)
                if bit and version != self.version and (self.policies / version).is_dir()
            }
            by_version = {v: self._model_for(v) for v in sorted(older)}
            agree = agreement(self.model, trained, by_version=by_version)
        else:
            older = () if ro.label == self.version else (self._model_for(ro.label),)
            agree = agreement(self.model, trained, older)
        if agree.mean >= self.cfg.agreement_limit and agree.worst is not None:
            w = agree.worst
            log(
                f"  AGREEMENT above {self.cfg.agreement_limit}: worst token {w.token_id} at "
                f"response position {w.position} of segment {w.segment_id} "
                f"(rollout {w.rollout_id}): trainer {w.trainer_logprob:.5f} vs engine "
                f"{w.engine_logprob:.5f}"
            )
        t0 = time.monotonic()
        loss_v, clip_v, grad_v = self._train(trained)
        train_s = time.monotonic() - t0
        version = self.vname(step)
        save_policy(
            self.model,
            Path(self.cfg.init_policy),
            self.policies / version,
            {"policy_version": version, "step": step, "parent": self.version},
        )
        self._save_optimizer(step)
        self.version = version
        scored = rewards(ro.outcomes)
        lags = batch.staleness
        return {
            "rollouts": len(ro.outcomes),
            "rollouts_ok": sum(1 for o in ro.outcomes if o.ok),
            "rows": table.num_rows,
            "rows_trained": len(trained),
            "rows_infra_error": batch.infra_error,
            "rows_stale": batch.stale,
            "stale_calls": batch.stale_calls,
            "tokens_trained": batch.tokens,
            "reward_mean": statistics.fmean(scored) if scored else None,
            "reward_std": statistics.pstdev(scored) if len(scored) > 1 else 0.0,
            "heldout_reward": mean_reward(ro.heldout),
            "agree_mean": agree.mean,
            "agree_max": agree.max,
            "ratio_mean": agree.ratio_mean,
            "tokens_sampled_by_label": agree.by_alternative,
            "worst_token": agree.worst,
            "staleness_max": max(lags) if lags else 0,
            "staleness_mean": statistics.fmean(lags) if lags else 0.0,
            "loss": loss_v,
            "clip_fraction": clip_v,
            "grad_norm": grad_v,
            "train_s": round(train_s, 3),
        }

    # ------------------------------------------------------------------ run
    async def run(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        state = RunState.load_or_create(self.out, self.cfg.run_id)
        self._start(state)
        await self._publish(state.step)
        client = await RolloutClient.connect(
            self.cfg.temporal, self.cfg.namespace, task_queue=self.cfg.task_queue
        )
        metrics = read_metrics(self.out)
        pending: asyncio.Future[Rollouts] | None = None
        for step in range(state.step + 1, self.cfg.steps + 1):
            step_start = time.monotonic()
            if pending is None:
                pending = await self._submit(client, state, step, self.version)
            ro = await pending
            pending = None
            if self.cfg.overlap and step < self.cfg.steps:
                # one-step off-policy: step+1 samples from the current weights meanwhile
                pending = await self._submit(client, state, step + 1, self.version)
            learn_start = time.monotonic()
            fields = await asyncio.to_thread(self._learn, step, ro)
            publish_s = await self._publish(step)
            learn_end = time.monotonic()
            overlap_s = 0.0
            if pending is not None:
                nxt = pending.result() if pending.done() and not pending.exception() else None
                end = nxt.finished if nxt is not None else learn_end
                overlap_s = max(0.0, min(end, learn_end) - learn_start)
            rollout_s = ro.finished - ro.started
            hidden = learn_end - learn_start
            done = self.last_publish
            total = len(ro.outcomes) + len(ro.heldout)
            m = StepMetrics(
                step=step,
                policy=self.vname(step),
                sampled_by=ro.label,
                rollout_s=round(rollout_s, 3),
                publish_s=round(publish_s, 3),
                overlap_s=round(overlap_s, 3),
                overlap_fraction=round(overlap_s / hidden, 3) if hidden > 0 else 0.0,
                publish_drained_calls=done.drained_calls if done else 0,
                publish_held_calls=done.held_calls if done else 0,
                step_s=round(learn_end - step_start, 3),
                rollouts_per_s=round(total / rollout_s, 4) if rollout_s > 0 else 0.0,
                **fields,  # type: ignore[arg-type]
            )
            metrics.append(m)
            write_metrics(self.out, metrics)
            state.step = step
            state.save()
            plot_curve(self.out, metrics)
            log(step_line(m))
        if pending is not None:
            pending.cancel()
        if self.heldout:
            final = await self._final_heldout(client, state)
            log(f"final policy={final.policy} heldout={fmt(final.heldout_reward)}")
            plot_curve(self.out, metrics, final)
        log(f"trained: {self.out}")
        return self.out

    async def _final_heldout(self, client: RolloutClient, state: RunState) -> FinalEval:
        """Held-out reward of the last policy (each step's held-out is of the policy it
        sampled with, so the trained result needs one more evaluation)."""
        path = self.out / FINAL_FILE
        if path.exists():
            final = FinalEval.model_validate_json(path.read_text())
            if final.policy == self.version:
                return final
        ro = await (await self._submit(client, state, state.step + 1, self.version, train=False))
        final = FinalEval(
            policy=self.version,
            heldout_reward=mean_reward(ro.heldout),
            heldout_rollouts=len(ro.heldout),
        )
        path.write_text(final.model_dump_json() + "\n")
        return final


async def _nothing() -> list[RolloutOutcome]:
    return []


@dataclass
class Rollouts:
    """One step's finished rollouts and the policy version they were submitted with."""

    label: str
    outcomes: list[RolloutOutcome]
    heldout: list[RolloutOutcome]
    started: float
    finished: float
