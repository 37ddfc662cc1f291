"""The trainer's path holds exactly the packages it may import, made in place."""

from pathlib import Path

from environments.trainer import TRAINER_PACKAGES, trainer_pythonpath

REPO = Path(__file__).resolve().parents[2]


def test_pythonpath_links_only_the_trainer_packages_and_is_remade(tmp_path: Path) -> None:
    target = tmp_path / "out" / ".trainer-pythonpath"
    for _ in range(2):  # a rerun replaces the links of a killed run
        made = trainer_pythonpath(REPO, target)
        assert made == target
        tops = sorted({name.split("/")[0] for name in TRAINER_PACKAGES})
        assert sorted(p.name for p in made.iterdir()) == tops
        assert sorted(p.name for p in (made / "gateway").iterdir()) == ["__init__.py", "engines"]
        assert (made / "gateway" / "engines").resolve() == REPO / "gateway" / "engines"
        assert "gateway/engines" in TRAINER_PACKAGES
        assert (made / "trainer").resolve() == REPO / "trainer"
        assert (made / "schemas" / "training.py").is_file()


def test_every_package_the_trainer_side_imports_is_on_its_path() -> None:
    """What the trainer, the bridges and the SDK import of ours, transitively, lies in
    `TRAINER_PACKAGES`: a package missing there fails only inside a trainer's process."""
    import grimp

    ours = ["schemas", "rollout_client", "task_formats", "bridges", "trainer", "gateway"]
    graph = grimp.build_graph(*ours, cache_dir=None)
    allowed = tuple(name.replace("/", ".") for name in TRAINER_PACKAGES)

    def on_path(module: str) -> bool:
        return any(module == top or module.startswith(top + ".") for top in allowed)

    reached = set()
    for root in ("rollout_client", "bridges", "trainer"):
        for module in graph.find_descendants(root) | {root}:
            reached |= graph.find_upstream_modules(module) | {module}
    parents = {".".join(m.split(".")[:i]) for m in reached for i in range(1, m.count(".") + 1)}
    missing = sorted(m for m in reached if not on_path(m) and m not in parents)
    assert missing == []
