"""Development, test and demo stand-ins: everything the product runs against locally.

What it owns:

- ``tiny_model``: the deterministic tiny Qwen3-style model (tokenizer, chat template,
  random weights) built from the word lists in ``tiny_model/words``; its task family
  (``tasks``, agent ``task_agent``) and the warm model trained on it (``warm``, which
  runs ``warmup`` with the vLLM venv's torch), cached by recipe hash;
- ``vllm_server``: the vLLM CPU virtual environment and a launcher for its API server;
- ``scripted_engine``: a fake engine speaking vLLM's token API from a script;
- ``background_server``: any ASGI app on a loopback port in a background thread;
- ``temporal_dev_server``: ``temporal server start-dev`` on free ports, WAL on;
- ``ports``: the one ``free_port`` helper;
- ``real_templates``: the real chat templates the tests read — their sources
  (``chat_template_sources.json``: hub repository, file, revision, sha256), the directory
  they are read from (``ROLLOUT_TEMPLATES_DIR``) and the checksum on read;
  ``template_fetch`` downloads them (``rollout templates fetch``).

Only ``workers`` (the demo and its local stack, ``rollout make-tiny-model``), ``tests``,
``bench``, ``stress`` and ``examples`` import this package; the product packages never
do. Of our packages it imports only ``schemas`` and ``gateway`` (an import contract): a
stand-in may reuse the gateway's own parts (its chat templates, its canonical forms), so
what it produces is what the gateway reads. Anything else callers pass in, e.g. the demo
hands the Temporal dev server the search attributes from ``schemas.rollout``.
"""
