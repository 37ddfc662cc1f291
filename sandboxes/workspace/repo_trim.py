"""Repositories that hold their base commit and its ancestors, and nothing after it.

Why: a repository with the refs of its source (other branches, tags, a remote's refs,
reflogs, a stash, notes, or only the objects of later commits) shows the agent the commit
that fixed its task: `git log --all -p` is SWE-bench's best-known leak, and RL finds it.
So the agent's repo keeps exactly what its base commit reaches, with HEAD detached there
and no ref, reflog, remote or other object besides.

Two ways a repo arrives, two ways to cut it:

* cloned on the host (`SandboxSpec.repo`): a fresh repository gets the base commit's
  objects alone from the host's mirror (`checkout_commit`), so later ones are never
  copied;
* already in the image (`SandboxSpec.image_repos`, e.g. SWE-bench's `/testbed`): cut in
  the sandbox before the agent starts (`trim_in_sandbox`): refs and reflogs deleted,
  what the base commit reaches repacked into one new pack, every other object dropped.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from sandboxes.base import ImageRepo, Sandbox, SandboxError

#: The fact provisioning records for the samples when it cut a repository's history.
TRIMMED = {"repo_history": "trimmed"}
#: No background gc or maintenance while the repo is being made or cut.
_QUIET_GIT = ("-c", "gc.auto=0", "-c", "maintenance.auto=false")


class RepoNotTrimmable(SandboxError, ValueError):
    """The image's repository is not what the task says (missing, base commit absent,
    checked out elsewhere). A ValueError: the task is refused, not retried."""


def git(*args: str, cwd: str | Path | None = None, stdin: str | None = None) -> str:
    """A host-side git command's stdout; a SandboxError with its stderr if it fails."""
    r = subprocess.run(
        ["git", *_QUIET_GIT, *args], cwd=cwd, input=stdin, capture_output=True, text=True
    )
    if r.returncode:
        raise SandboxError(f"git {' '.join(args)} failed: {r.stderr.strip()[-2000:]}")
    return r.stdout


def checkout_commit(mirror: Path, commit: str, work: Path) -> None:
    """A new repository at `work` holding `commit` and its ancestors from `mirror`, HEAD
    detached at `commit` and checked out: no ref, remote, reflog or FETCH_HEAD.

    The objects go from the mirror straight into one pack of the new repository (`git
    pack-objects --revs`, reusing the mirror's deltas and counting with its bitmap):
    written once with their index, never re-read as a fetch's `index-pack` would.
    """
    git("init", "--quiet", str(work))
    pack = work / ".git" / "objects" / "pack" / "pack"
    objects = ("pack-objects", "--quiet", "--revs", "--delta-base-offset", "--use-bitmap-index")
    git("-C", str(mirror), *objects, str(pack), stdin=f"{commit}\n")
    git("checkout", "--quiet", "--detach", commit, cwd=work)
    shutil.rmtree(work / ".git" / "logs", ignore_errors=True)  # checkout's HEAD entry


#: Cuts the repo at $1 to the history of $2 (its HEAD). Exit 3: no repository there;
#: 4: the commit is not in it; 5: HEAD is elsewhere; anything else: a git step failed.
#: Safe to run twice. Run in the clean room, whose git config also lets the sandbox user
#: cut a repo another uid owns (SWE-bench's images are root's, mode 777).
_TRIM = r"""
repo=$1 base=$2
g() { git -c gc.auto=0 -c maintenance.auto=false "$@"; }
cd "$repo" 2>/dev/null || { echo "$repo is not a directory"; exit 3; }
top=$(g rev-parse --show-toplevel 2>&1) && [ "$top" = "$(pwd -P)" ] || {
  echo "$repo is not the top of a git repository: $top"; exit 3; }
gd=$(g rev-parse --absolute-git-dir) || exit 6
[ "$gd" = "$(g rev-parse --path-format=absolute --git-common-dir)" ] || {
  echo "$repo is a linked worktree"; exit 3; }
g cat-file -e "$base^{commit}" 2>/dev/null || {
  echo "base commit $base is not in the repository at $repo"; exit 4; }
head=$(g rev-parse -q --verify 'HEAD^{commit}')
[ "$head" = "$base" ] || {
  echo "the repository at $repo is at ${head:-no commit}, not at its base commit $base"; exit 5; }
set -e
g update-ref --no-deref HEAD "$base"
g for-each-ref --format='delete %(refname)' | g update-ref --no-deref --stdin
for r in $(g remote); do g config --remove-section "remote.$r" 2>/dev/null || true; done
g reflog expire --expire=now --expire-unreachable=now --all
(cd "$gd" && rm -rf packed-refs logs worktrees remotes branches rr-cache lost-found \
  rebase-merge rebase-apply sequencer FETCH_HEAD ORIG_HEAD MERGE_HEAD MERGE_MSG MERGE_MODE \
  SQUASH_MSG AUTO_MERGE CHERRY_PICK_HEAD REVERT_HEAD REBASE_HEAD BISECT_* COMMIT_EDITMSG \
  info/grafts info/refs objects/info/packs objects/info/commit-graph* \
  objects/pack/*.keep objects/pack/multi-pack-index*)
g repack -a -d -q
g prune --expire=now
rm -f "$gd/objects/info/alternates"
"""


async def trim_in_sandbox(sb: Sandbox, repo: ImageRepo, timeout_s: float) -> None:
    """Cut the image's repository at `repo.path` to `repo.commit`'s history, in `sb`.

    Runs before the agent, with the sandbox's own git in the evaluator's clean room (the
    repo's hooks and fsmonitor do not run). The objects the base commit reaches are
    written once, as one new pack; the old packs go.
    """
    res = await sb.evaluator_exec(
        ["/bin/sh", "-c", _TRIM, "trim", repo.path, repo.commit],
        cwd="/",
        timeout=timeout_s,
        stop_processes=False,
    )
    out = (res.stdout + "\n" + res.stderr).strip()[-2000:]
    if res.exit_code in (3, 4, 5) and not res.timed_out:
        raise RepoNotTrimmable(f"image_repos: {out}")
    if not res.ok:
        raise SandboxError(
            f"cutting the history of the repository at {repo.path} failed "
            f"(exit {res.exit_code}, timed_out={res.timed_out}): {out}"
        )
