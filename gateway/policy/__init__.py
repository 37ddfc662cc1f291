"""The policy lifecycle: which weights the engines serve, and changing them without
losing work. `update`: the gate every engine call passes, and `POST /policy` (pause and
drain every gateway process, load the checkpoint into every engine, resume);
`external_sync`: the same pause and drain held around a weight sync the trainer does
itself; `history`: the update history every process shares; `update_marker`: the mark
of an update in progress that a restarted process reads; `checkpoint_roots`: where
checkpoints may come from.

It drives engines through `gateway.engines` (`WeightLoader`, vLLM's loader by default);
engine clients never import it.
"""
