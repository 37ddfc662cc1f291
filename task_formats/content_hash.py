"""A deterministic hash of a directory tree: what a task (or its environment) is made of.

The hash is the task's lineage (`TaskSource.content_hash`, the samples' env version) and
the cache key of an environment build, so it must be the same for the same content on
every machine and change when anything that matters changes. It covers, in sorted order
of relative path: each entry's kind, each file's executable bit and bytes, each
symlink's target text (never followed) and each directory, so an empty directory counts.

Only the executable bit of a mode is hashed: the other bits follow the umask of whoever
unpacked the dataset (and git keeps only that bit), so they would make the same dataset
hash differently on two hosts.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def _entries(root: Path, exclude: frozenset[str]) -> list[tuple[str, Path]]:
    """Every entry under `root` as (posix relative path, path), sorted; `exclude` names
    top-level entries to leave out."""
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        if here == root:
            dirnames[:] = [d for d in dirnames if d not in exclude]
            filenames = [f for f in filenames if f not in exclude]
        for name in (*dirnames, *filenames):
            path = here / name
            found.append((path.relative_to(root).as_posix(), path))
    found.sort(key=lambda item: item[0])
    return found


def _feed_file(digest: Any, path: Path) -> None:
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)


def hash_tree(
    root: Path | str,
    *,
    exclude: Iterable[str] = (),
    extra: Mapping[str, Any] | None = None,
) -> str:
    """``sha256:<hex>`` of everything under `root` (see the module docstring).

    `extra`: JSON-able settings that belong to the same key (e.g. a base-image map).
    Raises ValueError for an entry that is neither file, directory nor symlink.
    """
    root = Path(root)
    digest = hashlib.sha256()
    for rel, path in _entries(root, frozenset(exclude)):
        st = path.lstat()
        name = rel.encode()
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(path).encode()
            digest.update(b"L %d:%s %d:%s\n" % (len(name), name, len(target), target))
        elif stat.S_ISDIR(st.st_mode):
            digest.update(b"D %d:%s\n" % (len(name), name))
        elif stat.S_ISREG(st.st_mode):
            mark = b"x" if st.st_mode & 0o111 else b"-"
            digest.update(b"F %s %d:%s %d:" % (mark, len(name), name, st.st_size))
            _feed_file(digest, path)
            digest.update(b"\n")
        else:
            raise ValueError(f"{path}: not a regular file, directory or symlink")
    if extra:
        digest.update(b"E " + json.dumps(dict(extra), sort_keys=True).encode())
    return f"sha256:{digest.hexdigest()}"
