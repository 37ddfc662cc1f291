"""Which external images a Dockerfile names, and its copy rewritten through a map."""

from __future__ import annotations

import pytest

from sandboxes.image.dockerfile_refs import (
    DockerfileError,
    external_refs,
    lookup,
    normalize_ref,
    rewrite,
)

LOCAL = "agentic-rollout/sandbox-base:latest"


def resolved(text: str) -> list[str]:
    return [r.resolved for r in external_refs(text)]


def test_plain_from_is_rewritten_and_other_lines_untouched() -> None:
    text = "FROM ubuntu:24.04\n# a comment\nRUN echo a \\\n    b\nWORKDIR /app\n"
    refs = external_refs(text)
    assert [(r.keyword, r.resolved) for r in refs] == [("FROM", "ubuntu:24.04")]
    out = rewrite(text, {refs[0].instruction: LOCAL})
    assert out == f"FROM {LOCAL}\n# a comment\nRUN echo a \\\n    b\nWORKDIR /app\n"


def test_platform_flag_and_stage_name_are_kept() -> None:
    text = "FROM --platform=linux/amd64 ubuntu:24.04 AS build\nRUN make\n"
    refs = external_refs(text)
    assert resolved(text) == ["ubuntu:24.04"]
    out = rewrite(text, {refs[0].instruction: LOCAL})
    assert out.splitlines()[0] == f"FROM --platform=linux/amd64 {LOCAL} AS build"


def test_later_stages_referring_to_earlier_ones_are_not_external() -> None:
    text = (
        "FROM ubuntu:24.04 AS Build\nRUN make\n"
        "FROM build AS test\n"
        "FROM debian:12\nCOPY --from=build /out /out\nCOPY --from=0 /x /x\n"
        "COPY --from=python:3.12 /usr/bin/python3 /p\nFROM scratch\n"
    )
    refs = external_refs(text)
    assert [(r.keyword, r.resolved) for r in refs] == [
        ("FROM", "ubuntu:24.04"),
        ("FROM", "debian:12"),
        ("COPY", "python:3.12"),
    ]
    out = rewrite(text, {r.instruction: f"local/{i}" for i, r in enumerate(refs)})
    assert "FROM local/0 AS Build" in out
    assert "FROM build AS test" in out
    assert "FROM local/1\n" in out
    assert "COPY --from=build /out /out" in out
    assert "COPY --from=local/2 /usr/bin/python3 /p" in out
    assert out.rstrip().endswith("FROM scratch")


def test_arg_defaults_before_the_first_from_are_substituted() -> None:
    text = (
        "ARG BASE=ubuntu\nARG TAG=24.04\n"
        "FROM ${BASE}:$TAG\n"
        "FROM ${OTHER:-debian:12}\n"
        "ARG LATE=x\n"  # after FROM: a stage ARG, not a global one
    )
    refs = external_refs(text)
    assert resolved(text) == ["ubuntu:24.04", "debian:12"]
    assert refs[0].written == "${BASE}:$TAG"
    out = rewrite(text, {refs[0].instruction: LOCAL})
    assert f"FROM {LOCAL}\n" in out and "FROM ${OTHER:-debian:12}" in out


def test_unresolvable_variable_is_refused_with_the_line() -> None:
    with pytest.raises(DockerfileError, match=r"FROM \$\{BASE\}"):
        external_refs("ARG BASE\nFROM ${BASE}\n")


def test_no_from_is_refused() -> None:
    with pytest.raises(DockerfileError, match="no FROM"):
        external_refs("RUN echo hi\n")


def test_continued_from_and_escape_directive() -> None:
    text = "# escape=`\nFROM `\n  ubuntu:24.04 `\n  AS base\nRUN echo a\n"
    refs = external_refs(text)
    assert resolved(text) == ["ubuntu:24.04"]
    out = rewrite(text, {refs[0].instruction: LOCAL})
    assert out == f"# escape=`\nFROM `\n  {LOCAL} `\n  AS base\nRUN echo a\n"


def test_map_matches_however_the_image_is_spelled() -> None:
    assert normalize_ref("ubuntu") == "ubuntu:latest"
    assert normalize_ref("docker.io/library/ubuntu:24.04") == "ubuntu:24.04"
    assert normalize_ref("ghcr.io/org/img@sha256:ab") == "ghcr.io/org/img@sha256:ab"
    m = {"ubuntu:24.04": LOCAL, "python": "local/py"}
    assert lookup("docker.io/library/ubuntu:24.04", m) == LOCAL
    assert lookup("python:latest", m) == "local/py"
    assert lookup("ubuntu:22.04", m) is None
    assert lookup("localhost:5000/ubuntu", m) is None


def test_user_root_follows_a_stand_in_base_that_sets_another_user() -> None:
    text = "FROM ubuntu:24.04 \\\n  AS base\nRUN apt-get update\nFROM base\nRUN id"
    refs = external_refs(text)
    out = rewrite(text, {refs[0].instruction: LOCAL}, frozenset({refs[0].instruction}))
    assert out == f"FROM {LOCAL} \\\n  AS base\nUSER root\nRUN apt-get update\nFROM base\nRUN id\n"


def test_rewrite_adds_lines_after_every_from() -> None:
    text = "FROM a AS one\nRUN x\nFROM \\\n  b\nCOPY --from=one /f /f\n"
    out = rewrite(text, {}, after_every_from="LABEL k=v\n")
    want = "FROM a AS one\nLABEL k=v\nRUN x\nFROM \\\n  b\nLABEL k=v\nCOPY --from=one /f /f\n"
    assert out == want
