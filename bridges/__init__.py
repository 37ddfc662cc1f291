"""Trainer bridges: our samples, as the trainers people use take them.

The core, written once: `rollouts` (the trainer-neutral conversion: the training
rules), `groups` (groups streamed as they complete, batches, `collect_groups`), `tasks`
(the task behind a trainer's row), `runner` (our async clients for however the trainer
calls us) and `policy` (publishing a checkpoint through the Gateway). Each other module
is a thin adapter to one trainer's extension point, mapping our `TrainingRollout` to
the trainer's types, and the only place that trainer's package is imported. Runs in the
trainer's environment; imports only `schemas` and `rollout_client` of our packages, and
the core no adapter (import contracts).
"""
