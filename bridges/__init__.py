"""Trainer bridges: our samples, as the trainers people use take them.

`rollouts` is the one trainer-neutral conversion layer (the training rules, written
once); each other module is a thin adapter to one trainer's extension point and the only
place that trainer's package is imported. Runs in the trainer's environment; imports
only `schemas` and `rollout_client` of our packages (import contracts).
"""
