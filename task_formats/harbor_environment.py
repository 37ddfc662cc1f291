"""What a Harbor task's `[environment]` means for our sandbox: workdir, env, network.

Pure functions over the parsed `task.toml` (and the Dockerfile's text); each refuses
with a `TaskRefusal` naming the field, which the loader turns into a `RefusedTask`.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Collection, Mapping

from schemas.environment import NetworkMode, NetworkPolicy, parse_allowed_host
from task_formats.base import PublicNetwork
from task_formats.harbor_config import HarborAgent, HarborEnvironment, HarborVerifier


class TaskRefusal(Exception):
    """This task cannot be read as we would run it: `field` and why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


# --------------------------------------------------------------------------- workdir


def _logical_lines(text: str) -> list[str]:
    """Dockerfile lines with backslash continuations joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    if pending.strip():
        lines.append(pending)
    return lines


def dockerfile_workdir(text: str) -> str | None:
    """The working directory the Dockerfile's final stage ends with, or None when it
    sets none or uses a variable we cannot resolve (`WORKDIR $HOME`).

    Follows stages: a stage built `FROM` an earlier stage's name starts with its workdir.
    """
    by_stage: dict[str, str | None] = {}
    current: str | None = None
    stage_name: str | None = None
    for line in _logical_lines(text):
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            if stage_name is not None:
                by_stage[stage_name] = current
            words = [w for w in rest.split() if not w.startswith("--")]
            base = words[0].lower() if words else ""
            current = by_stage.get(base)
            lowered = [w.lower() for w in words]
            stage_name = words[lowered.index("as") + 1].lower() if "as" in lowered[1:-1] else None
        elif instruction == "WORKDIR":
            path = rest.strip().strip("\"'")
            if not path or "$" in path:
                current = None
            else:
                current = posixpath.normpath(posixpath.join(current or "/", path))
    return current


# --------------------------------------------------------------------------- env

_TEMPLATE_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
#: The command-line flag that lets a dataset read a variable (named in refusals).
ENV_ALLOW_FLAG = "--env-allow"


def resolve_env(
    values: Mapping[str, str],
    host: Mapping[str, str],
    allowed: Collection[str],
    field: str,
) -> dict[str, str]:
    """`values` with `${VAR}` / `${VAR:-default}` taken from `host` (Harbor's two forms).

    Only variables in `allowed` (the run's `--env-allow`) are read: a dataset is not
    trusted with the loading process's environment (tokens, cloud keys). Any other name
    refuses the task naming `field.KEY` and the flag, even with a default, since the
    same task would read the secret wherever it happens to be allowed or set. An allowed
    variable that is unset and has no default refuses it too."""
    resolved: dict[str, str] = {}
    for key, value in values.items():

        def substitute(match: re.Match[str], key: str = key) -> str:
            name, default = match.group(1), match.group(2)
            if name not in allowed:
                raise TaskRefusal(
                    f"{field}.{key}",
                    f"${{{name}}} names a variable of the loading process's environment "
                    f"that this run does not pass to datasets; allow it with "
                    f"{ENV_ALLOW_FLAG} {name}",
                )
            if name in host:
                return host[name]
            if default is not None:
                return default
            raise TaskRefusal(
                f"{field}.{key}", f"${{{name}}} is not set in the environment of this process"
            )

        resolved[key] = _TEMPLATE_RE.sub(substitute, value)
    return resolved


# --------------------------------------------------------------------------- network


def _hosts(hosts: list[str], field: str) -> list[str]:
    """The entries as the sandbox's network policy reads them (`parse_allowed_host`:
    ``host``, meaning ports 80 and 443, or ``host:port``; names, not IP addresses)."""
    out: list[str] = []
    for host in hosts:
        if not host.strip():
            continue
        try:
            name, port = parse_allowed_host(host)
        except ValueError as exc:
            raise TaskRefusal(field, str(exc)) from None
        entry = name if port is None else f"{name}:{port}"
        if entry not in out:
            out.append(entry)
    return out


def _phase(
    mode: NetworkMode | None, hosts: list[str], section: str
) -> tuple[NetworkMode | None, list[str]]:
    """One section's explicit policy: hosts without a mode mean an allowlist."""
    hosts = _hosts(hosts, f"{section}.allowed_hosts")
    if hosts and mode is None:
        mode = "allowlist"
    if hosts and mode != "allowlist":
        raise TaskRefusal(
            f"{section}.allowed_hosts", f"only valid with network_mode 'allowlist', not {mode!r}"
        )
    return mode, hosts


def agent_network(
    env: HarborEnvironment, agent: HarborAgent, public: PublicNetwork
) -> tuple[NetworkPolicy, str | None]:
    """The agent phase's policy ([agent] overrides [environment], whose default is
    Harbor's: public) and a note when `public` was downgraded to no network."""
    env_mode, env_hosts = _phase(env.network_mode, env.allowed_hosts, "environment")
    agent_mode, agent_hosts = _phase(agent.network_mode, agent.allowed_hosts, "agent")
    if agent_mode is not None:
        mode, hosts, field = agent_mode, agent_hosts, "agent.network_mode"
    elif env_mode is not None:
        mode, hosts, field = env_mode, env_hosts, "environment.network_mode"
    else:
        mode = "public" if env.allow_internet else "no-network"
        hosts, field = [], "environment.network_mode"
    if mode != "public":
        return NetworkPolicy(mode=mode, allowed_hosts=hosts), None
    if public == "allow":
        return NetworkPolicy(mode="public"), None
    if public == "refuse":
        unset = " (Harbor's default when it is not set)" if field.startswith("environment") else ""
        raise TaskRefusal(
            field, f"the task asks for the public network{unset}; this run refuses it"
        )
    return NetworkPolicy(mode="no-network"), "public→no-network"


def verifier_network(verifier: HarborVerifier) -> NetworkPolicy | None:
    """The verifier's own policy when it sets one (recorded; not enforced separately)."""
    mode, hosts = _phase(verifier.network_mode, verifier.allowed_hosts, "verifier")
    return NetworkPolicy(mode=mode, allowed_hosts=hosts) if mode is not None else None
