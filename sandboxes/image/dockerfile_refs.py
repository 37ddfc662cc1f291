"""The images a Dockerfile starts from, and a copy of it with those resolved locally.

Why: nothing can be pulled on a sandbox host without registry access, so every external
image a Dockerfile names (`FROM`, `COPY --from=`) must be present locally or mapped to a
local tag before the build starts. This module only reads and rewrites text (no docker):
`external_refs` lists what a build needs, `rewrite` returns the Dockerfile with the
mapped references replaced. References to earlier build stages are left alone.

What is understood: line continuations (and the `# escape=` directive), comments, flags
before the image (`--platform=…`), `AS name`, and `ARG`s declared before the first
`FROM` with defaults (`$X`, `${X}`, `${X:-word}`, `${X:+word}`); a reference that still
holds a `$` after that is refused (no build args are passed to these builds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DIRECTIVE = re.compile(r"^#\s*([a-zA-Z]+)\s*=\s*(\S+)\s*$")
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
_DEFAULT_REGISTRIES = ("docker.io/", "index.docker.io/", "registry-1.docker.io/")


class DockerfileError(ValueError):
    """The Dockerfile cannot be read as far as its base images go."""


@dataclass(frozen=True)
class ImageRef:
    """One external image the Dockerfile names."""

    #: 0-based index of the logical instruction (after joining continuations).
    instruction: int
    #: The reference as written (before ARG substitution).
    written: str
    #: After ARG substitution: what docker would look up.
    resolved: str
    #: "FROM" or "COPY".
    keyword: str


@dataclass
class _Instruction:
    keyword: str
    text: str  # the logical line, continuations joined (for reading only)
    lines: tuple[int, int]  # physical lines [first, last] it spans


def normalize_ref(ref: str) -> str:
    """`ubuntu`, `library/ubuntu:latest` and `docker.io/library/ubuntu` → one spelling,
    so a map entry matches however the Dockerfile writes the same image."""
    r = ref.strip()
    for reg in _DEFAULT_REGISTRIES:
        if r.startswith(reg):
            r = r[len(reg) :]
            break
    if r.startswith("library/"):
        r = r[len("library/") :]
    name = r.split("@", 1)[0]
    if "@" not in r and ":" not in name.rsplit("/", 1)[-1]:
        r += ":latest"
    return r


def _escape_char(lines: list[str]) -> str:
    for line in lines:  # parser directives: leading `# key=value` comments only
        m = _DIRECTIVE.match(line.strip())
        if not m:
            break
        if m.group(1).lower() == "escape":
            return m.group(2)
    return "\\"


def _instructions(text: str) -> list[_Instruction]:
    lines = text.splitlines()
    escape = _escape_char(lines)
    out: list[_Instruction] = []
    buf: list[str] = []
    first = 0
    for n, raw in enumerate(lines):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue  # comments, also inside continuations (docker drops them)
        if not buf:
            first = n
        if stripped.endswith(escape):
            buf.append(stripped[: -len(escape)])
            continue
        buf.append(stripped)
        _flush(out, buf, (first, n))
        buf = []
    if buf:
        _flush(out, buf, (first, len(lines) - 1))
    return out


def _flush(out: list[_Instruction], buf: list[str], span: tuple[int, int]) -> None:
    joined = " ".join(p for p in buf if p)
    if joined:
        out.append(_Instruction(joined.split(None, 1)[0].upper(), joined, span))


def _substitute(value: str, args: dict[str, str | None]) -> str:
    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(4)
        val = args.get(name)
        if m.group(2) == "-":
            return val if val else m.group(3)
        if m.group(2) == "+":
            return m.group(3) if val else ""
        if val is None:
            return m.group(0)  # unknown: left, refused by the caller
        return val

    return _VAR.sub(repl, value)


def _parse_args(text: str, args: dict[str, str | None]) -> None:
    for item in text.split()[1:]:
        name, eq, default = item.partition("=")
        args[name] = _substitute(default.strip("\"'"), args) if eq else args.get(name)


def _from_parts(text: str) -> tuple[str, str | None]:
    """(image as written, stage name or None) of a FROM instruction."""
    words = text.split()[1:]
    while words and words[0].startswith("--"):
        words.pop(0)
    if not words:
        raise DockerfileError(f"FROM without an image: {text!r}")
    image, stage = words[0], None
    if len(words) >= 3 and words[1].upper() == "AS":
        stage = words[2].lower()
    return image, stage


def _copy_from(text: str) -> str | None:
    for word in text.split()[1:]:
        if not word.startswith("--"):
            return None
        if word.startswith("--from="):
            return word[len("--from=") :]
    return None


def external_refs(text: str) -> list[ImageRef]:
    """Every external image the Dockerfile names, in order (stages and `scratch` left out)."""
    instructions = _instructions(text)
    args: dict[str, str | None] = {}
    stages: list[str] = []
    refs: list[ImageRef] = []
    seen_from = False
    for i, ins in enumerate(instructions):
        if ins.keyword == "ARG" and not seen_from:
            _parse_args(ins.text, args)
            continue
        if ins.keyword == "FROM":
            seen_from = True
            written, stage = _from_parts(ins.text)
            resolved = _substitute(written, args)
            if "$" in resolved:
                raise DockerfileError(
                    f"FROM {written}: cannot resolve the variable (give its ARG a default "
                    "before the first FROM, or write the image out)"
                )
            if resolved.lower() not in stages and resolved.lower() != "scratch":
                refs.append(ImageRef(i, written, resolved, "FROM"))
            stages.append(stage or f"#{len(stages)}")
        elif ins.keyword == "COPY":
            src = _copy_from(ins.text)
            if src is None or src.isdigit() or src.lower() in stages:
                continue
            if "$" in src:
                raise DockerfileError(f"COPY --from={src}: cannot resolve the variable")
            refs.append(ImageRef(i, src, src, "COPY"))
    if not seen_from:
        raise DockerfileError("no FROM instruction")
    return refs


def lookup(ref: str, image_map: dict[str, str]) -> str | None:
    """The local tag `ref` is mapped to, matching exact spelling first, then normalized."""
    if ref in image_map:
        return image_map[ref]
    want = normalize_ref(ref)
    for src, dst in image_map.items():
        if normalize_ref(src) == want:
            return dst
    return None


def rewrite(
    text: str,
    replacements: dict[int, str],
    root_after: frozenset[int] = frozenset(),
    after_every_from: str = "",
) -> str:
    """The Dockerfile with instruction `i`'s external image replaced by `replacements[i]`,
    `USER root` added after each FROM in `root_after`, and `after_every_from` (whole
    lines) after every FROM.

    Only the physical line holding the reference changes; every other byte stays as
    written (continuations, comments, RUN lines). `root_after`: a stand-in base that sets
    another user would run the Dockerfile's steps unlike the official image it replaces,
    which starts as root.
    """
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += "\n"
    instructions = _instructions(text)
    for i, new in replacements.items():
        ins = instructions[i]
        if ins.keyword == "FROM":
            written, _ = _from_parts(ins.text)
            pattern = re.compile(r"(?<!\S)" + re.escape(written) + r"(?!\S)")
            repl = new
        else:
            src = _copy_from(ins.text) or ""
            pattern = re.compile(r"--from=" + re.escape(src) + r"(?!\S)")
            repl = f"--from={new}"
        for n in range(ins.lines[0], ins.lines[1] + 1):
            m = pattern.search(lines[n])
            if m:
                lines[n] = lines[n][: m.start()] + repl + lines[n][m.end() :]
                break
        else:  # pragma: no cover - the reference was read from these lines
            raise DockerfileError(f"cannot find {ins.text!r} to rewrite")
        if i in root_after:
            last = ins.lines[1]
            lines[last] = lines[last] + "USER root\n"
    if after_every_from:
        for ins in instructions:
            if ins.keyword == "FROM":
                lines[ins.lines[1]] += after_every_from
    return "".join(lines)
