"""The closed loop with TRL's `GRPOTrainer` doing the update: `python -m trainer
CONFIG.json` with `"trainer": "trl"` (what `rollout demo --train --trainer trl` runs).

Same run as `trainer.loop` from the outside — same tasks per step, same held-out passes
on the same seeds, the same `OUT` layout (`policies/<run>-vN/`, `samples/step-000N/`,
`samples/heldout-000N/`, `metrics.jsonl` of `StepMetrics`, `final_heldout.json`,
`reward_curve.png`) and step lines — so the demo's table and verdict read either. What
differs is who computes the update: TRL's trainer, fed by the bridge (`bridges.trl`):

1. TRL's sampler hands `rollout_func` step k's tasks, each repeated `group_size` times;
   the bridge submits them as groups labelled with the served policy (and this runner
   adds the held-out pass when it is due), waits, and returns TRL's fields;
2. TRL scores them with the bridge's reward function, computes group advantages and
   takes one optimizer step (GRPO loss, `beta=0`: no reference model);
3. the bridge's callback saves `policies/<run>-vk` and publishes it through the
   Gateway's `POST /policy`; step k+1 is labelled vk. No overlap: TRL asks for the next
   batch only after the step, so every step is on-policy (staleness 0).

Train–inference agreement: TRL compares its own log-probs with the engine's only when
it drives vLLM itself, so :class:`_AgreementMixin` recomputes them with TRL's own
`_get_per_token_logps_and_entropies` on each generated batch, before the update, and
logs the mean and max |Δ| over the trained tokens.

Not supported here (the reference trainer has them): resuming a killed run, overlap.
"""

import os
import random
import statistics
import time
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bridges.trl import (
    EventLoopThread,
    GenerationRecord,
    PolicyLabel,
    PolicyPublisher,
    TrlRolloutSource,
    grpo_trainer_class,
    publish_callback,
    rollout_reward,
)
from rollout_client import GatewayPolicyClient, RolloutClient, RolloutOutcome
from schemas.tasks import RolloutTask, load_tasks
from schemas.training import FinalEval, StepMetrics, TrainConfig, policy_version_name
from trainer.batch import tasks_for_step
from trainer.heldout import collect, mean_reward, rewards, run_seed, submit_heldout
from trainer.loop import FINAL_FILE, RunState, log
from trainer.policy import load_policy, save_policy
from trainer.report import fmt, plot_curve, step_line, write_metrics


class _AgreementMixin:
    """Adds the agreement metrics to TRL's logged metrics (see the module docstring)."""

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = super()._generate_and_score_completions(inputs)  # type: ignore[misc]
        engine = out.get("sampling_per_token_logps")
        if engine is None:
            return out
        model: torch.nn.Module = self.model  # type: ignore[attr-defined]
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attention = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        mask = out["completion_mask"]
        if "tool_mask" in out:
            mask = mask * out["tool_mask"]
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                mine, _, _ = self._get_per_token_logps_and_entropies(  # type: ignore[attr-defined]
                    model, ids, attention, out["completion_ids"].size(1)
                )
        finally:
            model.train(was_training)
        keep = mask.bool()
        delta = (mine - engine)[keep]
        metrics = self._metrics["train"]  # type: ignore[attr-defined]
        if delta.numel():
            metrics["agreement/mean"].append(delta.abs().mean().item())
            metrics["agreement/max"].append(delta.abs().max().item())
            metrics["agreement/ratio_mean"].append(delta.exp().mean().item())
        return out


class TrlRunner:
    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out).resolve()
        self.policies = self.out / "policies"
        self.samples = self.out / "samples"
        self.tasks = load_tasks(cfg.tasks)
        self.heldout = load_tasks(cfg.heldout) if cfg.heldout else []
        if cfg.gateway is None:
            raise SystemExit("the TRL runner publishes through the Gateway: give `gateway`")
        if cfg.updates_per_step != 1:
            # TRL's num_iterations would take several optimizer steps per batch, each one
            # a global step (and a publish): not the reference's meaning of a step
            raise SystemExit("updates_per_step: the TRL runner takes 1 update per step")
        self.gateway = GatewayPolicyClient(cfg.gateway, os.environ.get("ROLLOUT_ADMIN_TOKEN"))
        self.loop = EventLoopThread()
        self.metrics: list[StepMetrics] = []
        self.generations: dict[int, GenerationRecord] = {}
        self.held: dict[int, list[RolloutOutcome]] = {}
        self.step_marks: dict[int, float] = {}
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    # ------------------------------------------------------------------ pieces
    def _step_tasks(self) -> list[RolloutTask]:
        """Step k's tasks in order, k = 1..steps: TRL's sampler (unshuffled) then hands
        step k exactly `tasks_for_step(k)`, the reference trainer's slice."""
        return [
            task
            for step in range(1, self.cfg.steps + 1)
            for task in tasks_for_step(self.tasks, step, self.cfg.tasks_per_step)
        ]

    def _per_step(self) -> int:
        return len(tasks_for_step(self.tasks, 1, self.cfg.tasks_per_step))

    def _save(self, model: Any, path: Path, version: str) -> None:
        parent = self.label.version or str(self.cfg.init_policy)  # v0's parent: the start
        step = int(version.rsplit("-v", 1)[-1])
        info = {"policy_version": version, "step": step, "parent": parent, "trainer": "trl"}
        save_policy(model, Path(self.cfg.init_policy), path, info)

    def _heldout(self, label: str, step: int) -> "Future[list[RolloutOutcome]]":
        """Start the held-out pass of `label` (step `step`'s); its outcomes, later."""

        async def go() -> list[RolloutOutcome]:
            batch = await submit_heldout(
                self.client,
                self.heldout,
                label,
                self.samples,
                step,
                self.cfg.heldout_samples,
                self.cfg.seed,
            )
            return await collect(self.client, batch)

        return self.loop.submit(go())

    def _rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """The bridge's rollout_func, with the held-out pass beside it when due."""
        step = int(trainer.state.global_step) + 1
        due = self.heldout and self.cfg.heldout_due(step)
        held = self._heldout(self.label.version, step) if due else None
        fields = self.source(prompts, trainer)
        self.held[step] = held.result() if held is not None else []
        return fields

    def _record(self, step: int, logs: dict[str, Any]) -> None:
        # popped: the runner keeps one batch of samples at a time, like the bridge
        gen = self.generations.pop(step)
        held = self.held.pop(step, [])
        converted = gen.converted
        scored = rewards(gen.outcomes)
        lags = converted.staleness
        trained = [r for r in converted.rollouts if r.trained]
        publish = self.publisher.last
        rollout_s = gen.finished - gen.started
        now = time.monotonic()
        total = len(gen.outcomes) + len(held)
        m = StepMetrics(
            step=step,
            policy=self.vname(step),
            sampled_by=gen.label,
            rollouts=len(gen.outcomes),
            rollouts_ok=sum(1 for o in gen.outcomes if o.ok),
            rows=gen.rows,
            rows_trained=len(trained),
            rows_infra_error=converted.infra_error,
            rows_stale=converted.stale,
            stale_calls=converted.stale_calls,
            tokens_trained=sum(r.primary.trained_tokens for r in trained),
            reward_mean=statistics.fmean(scored) if scored else None,
            reward_std=statistics.pstdev(scored) if len(scored) > 1 else 0.0,
            heldout_reward=mean_reward(held) if held else None,
            agree_mean=float(logs.get("agreement/mean") or 0.0),
            agree_max=float(logs.get("agreement/max") or 0.0),
            ratio_mean=float(logs.get("agreement/ratio_mean") or 1.0),
            staleness_max=max(lags) if lags else 0,
            staleness_mean=statistics.fmean(lags) if lags else 0.0,
            loss=float(logs.get("loss") or 0.0),
            clip_fraction=float(logs.get("clip_ratio/region_mean") or 0.0),
            grad_norm=float(logs.get("grad_norm") or 0.0),
            rollout_s=round(rollout_s, 3),
            train_s=round(self.step_marks.get(step, now) - gen.finished, 3),
            publish_s=round(self.publisher.last_s, 3),
            publish_drained_calls=publish.drained_calls if publish else 0,
            publish_held_calls=publish.held_calls if publish else 0,
            step_s=round(now - gen.started, 3),
            rollouts_per_s=round(total / rollout_s, 4) if rollout_s > 0 else 0.0,
        )
        self.metrics.append(m)
        write_metrics(self.out, self.metrics)
        self.state.step = step
        self.state.save()
        plot_curve(self.out, self.metrics)
        log(step_line(m))

    def _callbacks(self) -> list[Any]:
        from transformers import TrainerCallback

        runner = self

        class StepRecorder(TrainerCallback):  # type: ignore[misc]
            """Marks the end of the update (before the publish callback runs) and writes
            the step's metrics when TRL logs them (right after the step)."""

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
                runner.step_marks[int(state.global_step)] = time.monotonic()
                return control

            def on_log(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
                logs = kw.get("logs") or {}
                step = int(state.global_step)
                if "loss" in logs and step in runner.generations:
                    runner._record(step, logs)
                return control

        return [StepRecorder(), publish_callback(self.publisher)]

    def vname(self, index: int) -> str:
        return policy_version_name(self.state.run_id, index)

    # ------------------------------------------------------------------ run
    def run(self) -> Path:
        # the step lines are the output: TRL's notices about its experimental rollout_func
        # and about a vLLM newer than it lists (it never drives vLLM here) are not
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        warnings.filterwarnings("ignore", message="TRL currently supports vLLM")
        from datasets import Dataset
        from transformers import AutoTokenizer, PrinterCallback
        from trl import GRPOConfig

        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        self.state = RunState.load_or_create(self.out, cfg.run_id)
        if self.state.step > 0:
            raise SystemExit(
                f"{self.out} holds a run at step {self.state.step}: the TRL runner does not "
                "resume; give a new out directory"
            )
        self.client = self.loop.run(
            RolloutClient.connect(cfg.temporal, cfg.namespace, task_queue=cfg.task_queue)
        )
        model = load_policy(Path(cfg.init_policy))
        tokenizer = AutoTokenizer.from_pretrained(cfg.init_policy)
        self.label = PolicyLabel(version="")
        self.publisher = PolicyPublisher(
            gateway=self.gateway,
            runner=self.loop,
            label=self.label,
            policies_dir=self.policies,
            version_name=self.vname,
            save=self._save,
        )
        self.publisher.publish(model, 0)
        self.state.step = 0
        self.state.save()
        write_metrics(self.out, [])
        step_tasks = self._step_tasks()
        self.source = TrlRolloutSource(
            client=self.client,
            runner=self.loop,
            tasks={t.task_id: t for t in step_tasks},
            samples_dir=self.samples,
            label=self.label,
            group_size=cfg.group_size,
            run_seed=run_seed(cfg.seed),
            max_staleness=cfg.max_staleness,
            placeholder_id=int(tokenizer.eos_token_id),
            on_generation=lambda rec: self.generations.__setitem__(rec.step, rec),
        )
        args = GRPOConfig(
            output_dir=str(self.out / "trl"),
            per_device_train_batch_size=self._per_step() * cfg.group_size,
            num_generations=cfg.group_size,
            steps_per_generation=1,
            gradient_accumulation_steps=1,
            num_iterations=1,
            max_steps=cfg.steps,
            learning_rate=cfg.lr,
            adam_epsilon=cfg.adam_eps,
            weight_decay=0.0,
            lr_scheduler_type="constant",
            warmup_steps=0,
            max_grad_norm=cfg.max_grad_norm,
            beta=0.0,
            epsilon=cfg.clip_low,
            epsilon_high=cfg.clip_high,
            temperature=1.0,
            shuffle_dataset=False,
            gradient_checkpointing=False,
            bf16=False,
            fp16=False,
            use_cpu=True,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=cfg.seed,
        )
        dataset = Dataset.from_list([{"prompt": t.task_id} for t in step_tasks])
        trainer_cls = type("AgreementGRPOTrainer", (_AgreementMixin, grpo_trainer_class()), {})
        trainer = trainer_cls(
            model=model,
            reward_funcs=[rollout_reward],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=self._rollout_func,
            callbacks=self._callbacks(),
        )
        # transformers prints every log dict when tqdm is off; our step line replaces it
        trainer.remove_callback(PrinterCallback)
        try:
            trainer.train()
            final = self._final(model)
        finally:
            self.loop.close()
        if final is not None:
            log(f"final policy={final.policy} heldout={fmt(final.heldout_reward)}")
            plot_curve(self.out, self.metrics, final)
        log(f"trained: {self.out}")
        return self.out

    def _final(self, model: Any) -> FinalEval | None:
        """Held-out reward of the last policy (served now: the callback published it)."""
        if not self.heldout:
            return None
        version = self.label.version
        held = self._heldout(version, self.cfg.steps + 1).result()
        final = FinalEval(
            policy=version, heldout_reward=mean_reward(held), heldout_rollouts=len(held)
        )
        (self.out / FINAL_FILE).write_text(final.model_dump_json() + "\n")
        return final


def run(cfg: TrainConfig) -> Path:
    return TrlRunner(cfg).run()
