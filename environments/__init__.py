"""The Python environments the project creates on a host, once, under the cache directory:
vLLM's CPU build (`vllm_cpu`) and one overlay per trainer on it (`trainer`), which
`rollout train` and `rollout demo` run the trainer in.

Of our packages it imports only `schemas`: the shipped commands reach these without the
dev stand-ins in `devstack`."""
