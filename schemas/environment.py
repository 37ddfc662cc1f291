"""How a task's environment is made and what network it may reach.

Two contracts a dataset's task brings with it (a Harbor task's `[environment]`, a
SWE-bench instance's image) that are not files in the workspace: a Dockerfile the
sandbox host builds into the image the agent runs in, and the network policy of the
sandbox. They live with the task so a malformed one is refused when the task is read.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from schemas.base import StrictModel

#: The network a Dockerfile's RUN steps get (`docker build --network`): `none` unless the
#: run chose otherwise, so a dataset's build cannot fetch code or reach the build host.
BuildNetwork = Literal["none", "default", "host"]

#: `sha256:` plus 64 hex digits: the cache key of a build.
_CONTENT_HASH_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


class EnvironmentBuild(StrictModel):
    """A Dockerfile the sandbox host builds into the task's image before provisioning.

    The build is cached by `content_hash` (every file of the context, the Dockerfile and
    the base-image map), so the same environment is built once per host however many
    tasks share it. `context` is a path on the sandbox hosts (a local run, or a dataset
    on storage every host mounts).
    """

    context: str = Field(min_length=1, description="absolute path of the build context")
    dockerfile: str = Field(default="Dockerfile", min_length=1, description="relative to context")
    content_hash: str = Field(description="sha256:<hex> of the context and the Dockerfile")
    timeout_s: float = Field(default=600.0, gt=0, description="the build's time limit")
    #: Base images that cannot be pulled here, resolved to local tags (`FROM` rewritten).
    base_image_map: dict[str, str] = Field(default_factory=dict)
    #: The RUN steps' network; part of the cache key (an image built with network is
    #: not the one a network-less build of the same Dockerfile makes).
    network: BuildNetwork = "none"

    @field_validator("content_hash")
    @classmethod
    def _is_sha256(cls, v: str) -> str:
        if not _CONTENT_HASH_RE.match(v):
            raise ValueError("content_hash must be 'sha256:' followed by 64 hex digits")
        return v

    @field_validator("context")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"build context {v!r} must be an absolute path")
        return v


NetworkMode = Literal["no-network", "allowlist", "public"]

#: One DNS label: letters, digits and inner hyphens, 1-63 characters.
_LABEL_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def parse_allowed_host(entry: str) -> tuple[str, int | None]:
    """``host`` or ``host:port`` → (lower-cased host name, port or None).

    The host must be a DNS name: the sandbox reaches it by name through a relay (an IP
    address has no name to map inside the sandbox), and ``localhost`` is the sandbox's
    own loopback, never a host outside it. Raises ValueError saying what is wrong.
    """
    host, sep, port_text = entry.strip().rpartition(":")
    if not sep:
        host, port_text = port_text, ""
    host = host.lower().rstrip(".")
    port: int | None = None
    if sep:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"allowed host {entry!r}: port must be a number 1-65535")
        port = int(port_text)
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    else:
        raise ValueError(f"allowed host {entry!r}: must be a host name, not an IP address")
    labels = host.split(".")
    if not host or len(host) > 253 or not all(_LABEL_RE.match(lb) for lb in labels):
        raise ValueError(
            f"allowed host {entry!r}: not a valid host name (letters, digits, '-' and '.', "
            "no wildcards, no scheme or path)"
        )
    if labels[-1] == "localhost":
        raise ValueError(f"allowed host {entry!r}: localhost is the sandbox itself")
    return host, port


class NetworkPolicy(StrictModel):
    """What the sandbox may reach besides its Gateway session (always reachable).

    `no-network`: nothing else. `allowlist`: only `allowed_hosts`, each ``host`` (ports
    80 and 443) or ``host:port``; an empty list is the same as no-network. `public`:
    anything, and only when the operator allowed it. Entries are normalized to
    lower-case ``host`` / ``host:port``.
    """

    mode: NetworkMode = "no-network"
    allowed_hosts: list[str] = Field(default_factory=list)

    @field_validator("allowed_hosts")
    @classmethod
    def _valid_hosts(cls, v: list[str]) -> list[str]:
        out: list[str] = []
        for entry in v:
            host, port = parse_allowed_host(entry)
            norm = host if port is None else f"{host}:{port}"
            if norm not in out:
                out.append(norm)
        return out

    @model_validator(mode="after")
    def _hosts_only_for_allowlist(self) -> NetworkPolicy:
        if self.allowed_hosts and self.mode != "allowlist":
            raise ValueError(f"allowed_hosts is only for mode 'allowlist', not {self.mode!r}")
        return self

    def effective_mode(self) -> NetworkMode:
        """The mode a sandbox gets: an allowlist with no host is no-network."""
        if self.mode == "allowlist" and not self.allowed_hosts:
            return "no-network"
        return self.mode
