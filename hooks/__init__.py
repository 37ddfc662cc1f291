"""Built-in rollout hooks (logs, evaluate, diff, artifacts, metrics).

Hooks see the task, a sandbox and the run's outcome, which they add to. They import
only `schemas` and the sandbox protocol (`sandboxes.base`): never a harness, a backend,
`gateway`, `activities` or `workflows` (checked by the import contract).

`base` holds the protocol (`Hook` with before_run / after_run / on_error), the shared
`HookContext` and the registry; `build_hooks(specs)` validates every params block before
any sandbox exists. Task-side specs (`HookSpec`) and result models are in `schemas`.
"""
