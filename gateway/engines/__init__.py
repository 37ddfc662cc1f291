"""Engine clients: the `Engine` protocol (`base`) and one client per engine behind it,
vLLM's (`vllm`; its reply shapes `vllm_wire`, its in-place weight loading
`vllm_weights`) and SGLang's (`sglang`, for engines a trainer owns); apart from any
engine, session placement and routing (`routing`), per-engine stats (`stats`) and what
an engine must offer (`engine_check`).

It knows nothing of the policy lifecycle (`gateway.policy` drives engines, never the
reverse) and must not import the HTTP app, calls, sessions, capture, observability or
parsers; `base` and `vllm_weights` import nothing heavier than pydantic and httpx (the
trainer imports `vllm_weights` in its own environment).
"""
