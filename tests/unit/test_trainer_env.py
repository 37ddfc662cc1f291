"""The trainer's path holds exactly the packages it may import, made in place."""

from pathlib import Path

from devstack.trainer_env import TRAINER_PACKAGES, trainer_pythonpath

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
