"""Process entry points: the `rollout` CLI, Temporal workers, the gateway server launcher.

The only package allowed to wire every other package together.
"""
