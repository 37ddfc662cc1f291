"""Contract test of the slime bridge against slime's own `Sample`.

slime cannot be installed here: THUDM/slime is on no package index (the PyPI project named
`slime`, 0.0.0, is an unrelated linear mixed-effects package that also claims the import
name), it is installed from its git tree or Docker image, and its runtime needs
Megatron-LM and SGLang on CUDA GPUs. So this test checks the bridge's output against the
field list, annotations and defaults of `Sample` read from `slime/utils/types.py` at
commit 624b824a898ab0ec1fcb4d373004c7f3852bf515 (`bridges.slime.SLIME_COMMIT`), and
against the invariants slime's rollout → training path enforces at that commit
(`Sample._validate_response_metadata_lengths`, `validate_rollout_id_annotated`,
`RolloutManager._convert_samples_to_train_data`). Where THUDM/slime imports, the last
test runs the same checks on samples built from slime's own classes.
"""

import dataclasses
import itertools
from typing import Any

import pytest

from bridges import slime as bridge
from bridges.rollouts import ConversionRules, to_training_rollouts

# slime/utils/types.py @ 624b824: field → (annotation as written, default).
SLIME_SAMPLE_FIELDS: dict[str, tuple[str, Any]] = {
    "group_index": ("int | None", None),
    "index": ("int | None", None),
    "rollout_id": ("int | None", None),
    "prompt": ("str | list[dict[str, str]]", ""),
    "tokens": ("list[int]", []),
    "multimodal_inputs": ("dict[str, Any] | None", None),
    "multimodal_train_inputs": ("dict[str, Any] | None", None),
    "multimodal_train_input_id": ("str | None", None),
    "apply_chat_template_kwargs": ("dict", {}),
    "response": ("str", ""),
    "response_length": ("int", 0),
    "label": ("str | None", None),
    "reward": ("float | dict[str, Any] | None", None),
    "loss_mask": ("list[int] | None", None),
    "weight_versions": ("list[str]", []),
    "rollout_log_probs": ("list[float] | None", None),
    "rollout_top_p_token_ids": ("list[int] | torch.Tensor | None", None),
    "rollout_top_p_token_offsets": ("list[int] | torch.Tensor | None", None),
    "rollout_routed_experts": ("list[list[int]] | torch.Tensor | None", None),
    "remove_sample": ("bool", False),
    "teacher_log_probs": ("list[float] | None", None),
    "status": ("Status", "pending"),
    "metadata": ("dict", {}),
    "generate_function_path": ("str | None", None),
    "custom_rm_path": ("str | None", None),
    "train_metadata": ("dict | None", None),
    "session_id": ("str | None", None),
    "non_generation_time": ("float", 0.0),
    "spec_info": ("SpecInfo", None),
    "prefix_cache_info": ("PrefixCacheInfo", None),
}
SLIME_STATUSES = {"pending", "completed", "truncated", "aborted", "failed"}
# What the stand-in leaves out, and why (its docstring says the same).
LEFT_OUT = {"spec_info", "prefix_cache_info"}  # SGLang statistics


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def test_the_stand_in_has_slimes_fields_annotations_and_defaults() -> None:
    fields = {f.name: f for f in dataclasses.fields(bridge.SampleShape)}
    assert set(fields) == set(SLIME_SAMPLE_FIELDS) - LEFT_OUT
    for name, f in fields.items():
        annotation, default = SLIME_SAMPLE_FIELDS[name]
        if name == "status":
            assert _default(f).value == default
            continue
        # The stand-in drops only the torch.Tensor alternative of the replay fields.
        assert f.type == annotation.replace(" | torch.Tensor", ""), name
        assert _default(f) == default, name
    assert {s.value for s in bridge.SampleShape.Status} == SLIME_STATUSES
    assert [f.name for f in dataclasses.fields(bridge.TrainOutputShape)] == ["samples", "metrics"]
    assert [f.name for f in dataclasses.fields(bridge.EvalOutputShape)] == ["data", "metrics"]


def rows() -> list[dict[str, Any]]:
    """A group of four: a two-segment rollout (compaction), a multi-turn one, a
    truncated one and an infra error."""

    def row(rid: str, index: int, segment: str, mask: list[int], status: str = "ok") -> dict:
        return {
            "rollout_id": rid,
            "task_id": "t",
            "group_id": "b-t",
            "sample_index": index,
            "segment_id": segment,
            "prompt_ids": [1, 2, 3],
            "response_ids": list(range(20, 20 + len(mask))),
            "loss_mask": mask,
            "logprobs": [-0.25 if bit else 0.0 for bit in mask],
            "reward": 1.0 if index % 2 == 0 else 0.0,
            "status": status,
            "policy_version": "run-v2",
            "call_policy_versions": ["run-v2"],
            "call_starts": [0],
        }

    return [
        row("b-t-0", 0, "s0", [1, 1, 0, 0, 1]),
        row("b-t-0", 0, "s1", [1, 1]),
        row("b-t-1", 1, "s0", [1, 0, 1]),
        row("b-t-2", 2, "s0", [1, 1, 1], status="truncated"),
        row("b-t-3", 3, "s0", [1, 1], status="infra_error"),
    ]


def check_slime_invariants(groups: list[list[list[Any]]], sample_cls: type) -> None:
    """What slime's rollout → training path asserts or relies on, at SLIME_COMMIT."""
    for group in groups:
        for siblings in group:
            # validate_rollout_id_annotated: siblings of one rollout share one rollout_id.
            ids = {s.rollout_id for s in siblings}
            assert len(ids) == 1 and None not in ids
    # RolloutManager flattens while the first element is a list: two levels.
    flat = list(itertools.chain.from_iterable(itertools.chain.from_iterable(groups)))
    assert all(isinstance(s, sample_cls) for s in flat)
    for s in flat:
        assert isinstance(s.status, sample_cls.Status)
        assert isinstance(s.reward, float) and isinstance(s.index, int)
        assert s.response_length > 0 and len(s.tokens) > s.response_length
        assert len(s.loss_mask) == s.response_length  # _convert_samples_to_train_data
        assert len(s.rollout_log_probs) == s.response_length  # off-policy correction
        assert set(s.loss_mask) <= {0, 1}
        assert all(isinstance(v, str) for v in s.weight_versions)
        # Read from samples[0] and then taken for all: all set, or all None.
        assert s.train_metadata is None and s.teacher_log_probs is None


def test_bridge_output_meets_slimes_training_invariants() -> None:
    batch = to_training_rollouts(rows(), ConversionRules(current_version=2))
    groups = bridge.convert_batch(batch)
    check_slime_invariants(groups, bridge.Sample)
    statuses = [[s.status.value for s in r] for r in groups[0]]
    assert statuses == [["completed", "completed"], ["completed"], ["truncated"], ["aborted"]]


def test_with_slimes_own_classes_where_slime_imports() -> None:
    """Runs only where THUDM/slime's `slime.utils.types` imports (not on PyPI; see the
    module docstring): the bridge then builds slime's own `Sample`, and slime's own
    validators accept what it built."""
    types = pytest.importorskip("slime.utils.types", reason="THUDM/slime is not installed")
    from slime.observability.rollout_data_utils import validate_rollout_id_annotated

    assert bridge.SLIME_IMPORTS and bridge.Sample is types.Sample
    batch = to_training_rollouts(rows(), ConversionRules(current_version=2))
    groups = bridge.convert_batch(batch)
    check_slime_invariants(groups, types.Sample)
    validate_rollout_id_annotated(groups)
    for sample in itertools.chain.from_iterable(itertools.chain.from_iterable(groups)):
        sample._validate_response_metadata_lengths()
        assert types.Sample.from_dict(sample.to_dict()).tokens == sample.tokens
    fields = {f.name for f in dataclasses.fields(types.Sample)}
    assert fields == set(SLIME_SAMPLE_FIELDS)
