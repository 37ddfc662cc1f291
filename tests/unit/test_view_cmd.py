"""`rollout view` as a process: its first line is the URL; a path that is not samples is
refused saying what was expected; bound beyond loopback it requires a token."""

import re
from pathlib import Path

import httpx
from typer.testing import CliRunner

from devstack.browser import rollout_view
from devstack.sample_batch import rollout_rows, write_rollout
from workers.cli import app


def test_first_line_is_the_url_and_pages_answer(tmp_path: Path) -> None:
    write_rollout(tmp_path, rollout_rows("r-1", "t"))
    with rollout_view(str(tmp_path)) as url:
        assert re.fullmatch(r"http://localhost:\d+/", url)
        assert "/rollout/r-1" in httpx.get(url).text
        assert httpx.get(url, headers={"host": "attacker.example"}).status_code == 400


def test_not_a_samples_dir_is_refused(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["view", str(tmp_path)])
    assert done.exit_code == 2
    assert "not a samples directory: expected <rollout_id>.parquet" in done.output


def test_beyond_loopback_a_token_is_required(tmp_path: Path) -> None:
    write_rollout(tmp_path, rollout_rows("r-1", "t"))
    with rollout_view(str(tmp_path), "--host", "0.0.0.0") as url:
        token = re.fullmatch(r"http://0\.0\.0\.0:(\d+)/\?token=(\S+)", url)
        assert token is not None
        base = f"http://127.0.0.1:{token[1]}/"
        assert httpx.get(base).status_code == 401
        with httpx.Client(follow_redirects=True) as client:
            page = client.get(f"{base}?token={token[2]}")
            assert page.status_code == 200 and "/rollout/r-1" in page.text
            assert client.get(f"{base}rollout/r-1").status_code == 200  # the cookie
