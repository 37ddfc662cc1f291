"""Built-in rollout hooks (logs, evaluate, diff, artifacts, metrics).

Hooks see a sandbox and the agent result; they must not import `workflows` or `gateway`.

`base` holds the protocol (`Hook` with before_run / after_run / on_error), `HookSpec`
(name + params, configured per task), the shared `HookContext` and the registry;
`build_hooks(specs)` validates every params block before any sandbox exists.
"""
