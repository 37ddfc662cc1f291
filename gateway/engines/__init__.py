"""Engines: the `Engine` protocol (`base`), the vLLM implementation (`vllm`, its reply
shapes `vllm_wire`, its weight loading `vllm_weights`), the SGLang one (`sglang`, for
engines a trainer owns), session placement and routing (`routing`), per-engine stats
(`stats`), policy updates (`policy_update`: pause, drain, load weights, resume), holds
around a weight sync the trainer does itself (`external_sync`), and what an engine must
offer (`engine_check`).

It must not import the HTTP app, calls, sessions, capture, observability or parsers; and
`base` and `vllm_weights` import nothing heavier than pydantic and httpx (the trainer
imports `vllm_weights` in its own environment).
"""
