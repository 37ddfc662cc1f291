"""What a check raises when it could not be carried out and the evidence says the agent
caused it (not: the evaluator is broken)."""

from __future__ import annotations


class AgentCausedEvalFailure(RuntimeError):
    """The check produced no verdict after the agent ran, where it was shown to work
    before (a SWE-bench check's preflight): the agent's failure, scored 0.

    `reason` is the short why (the evaluation's `damage`); the message adds the detail.
    The evaluate hook maps it to status ``agent_broke_sandbox``.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}; {detail}" if detail else reason)
        self.reason = reason
