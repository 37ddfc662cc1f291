"""The viewer in a real browser: `rollout view` served as a process, opened by headless
Chromium (Selenium), clicked through as a person would: batch → rollout → evaluation.
Each test says what it proves; the page-level cases are in tests/unit/test_viewer_pages.py.
"""

from collections.abc import Iterator

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select
from tokenizers import Tokenizer

from devstack.sample_batch import (
    eval_error,
    passed_evaluation,
    result,
    rollout_rows,
    write_artifacts,
    write_manifest,
    write_rollout,
)
from devstack.tiny_model import ensure_tiny_model
from tests.fixtures.browser import headless_chromium, rollout_view

pytestmark = [pytest.mark.integration]

SCRIPT = "<script>window.pwned = 1</script>"
NOT_FOUND = "sh: 1: python: not found"


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def chromium() -> Iterator[webdriver.Chrome]:
    with headless_chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A batch of three rollouts (one with a `<script>` in the agent's message, one whose
    evaluator broke) served by `rollout view` with the tiny model's tokenizer."""
    root = tmp_path_factory.mktemp("viewer")
    out, data = root / "b1", root / "worker"
    out.mkdir()
    model = ensure_tiny_model()
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    prompt = _ids(tok, "<|im_start|>user\nWrite 42 to answer.txt<|im_end|>\n")
    turns = [
        (
            _ids(tok, f"<|im_start|>assistant\nI will look first. {SCRIPT}<|im_end|>\n"),
            _ids(tok, "<|im_start|>tool\nanswer.txt: empty<|im_end|>\n"),
        ),
        (
            _ids(tok, "<|im_start|>assistant\necho 42 > answer.txt<|im_end|>\n"),
            _ids(tok, "<|im_start|>user\nDone?<|im_end|>\n"),
        ),
    ]
    failed = eval_error(NOT_FOUND)
    write_rollout(out, rollout_rows("r-ok", "add", prompt_ids=prompt, turns=turns))
    write_rollout(out, rollout_rows("r-zero", "add", reward=0.0, prompt_ids=prompt, turns=turns))
    write_rollout(
        out,
        rollout_rows(
            "r-err",
            "mul",
            reward=0.0,
            status="infra_error",
            rollout_status="eval_error",
            status_reason=f"check 'tests' could not run: {NOT_FOUND}",
            evaluation=failed,
            prompt_ids=prompt,
            turns=turns,
        ),
    )
    write_artifacts(
        data, "r-ok", passed_evaluation(), "--- a/answer.txt\n+++ b/answer.txt\n+42\n", "ok\n"
    )
    write_artifacts(data, "r-err", failed, "", "ran the tests\n")
    write_manifest(
        out,
        "b1",
        [
            result("r-ok", "add", "ok", 1.0),
            result("r-zero", "add", "ok", 0.0),
            result("r-err", "mul", "eval_error", None),
        ],
    )
    with rollout_view(str(out), "--artifacts", str(data), "--tokenizer", str(model)) as url:
        yield url


def test_batch_to_rollout_marks_trained_tokens(chromium: webdriver.Chrome, served: str) -> None:
    """From the batch page a click opens the rollout; its sampled tokens (loss mask 1)
    are drawn differently from the prompt and tool results, and hovering one reads out
    its id, logprob and policy version."""
    chromium.get(served)
    chromium.find_element(By.LINK_TEXT, "r-ok").click()
    assert chromium.current_url.endswith("/rollout/r-ok")
    trained = chromium.find_elements(By.CSS_SELECTOR, "#tokens span.tok.t")
    others = chromium.find_elements(By.CSS_SELECTOR, "#tokens span.tok:not(.t)")
    assert trained and others
    line = "border-bottom-style"
    assert trained[0].value_of_css_property(line) == "solid"
    assert others[0].value_of_css_property(line) == "none"
    readout = trained[0].get_attribute("title")
    assert " id " in readout and "logprob -" in readout and "policy v0" in readout
    text = chromium.find_element(By.ID, "tokens").text
    assert "echo 42 > answer.txt" in text and "answer.txt: empty" in text


def test_evaluation_shows_reward_and_check_detail(chromium: webdriver.Chrome, served: str) -> None:
    """The rollout's evaluation tab shows its reward, each check with its detail and
    the diff the agent made (read from the worker's data dir)."""
    chromium.get(served + "rollout/r-ok")
    chromium.find_element(By.ID, "evaluation-link").click()
    assert chromium.find_element(By.ID, "reward").text == "1"
    checks = chromium.find_element(By.ID, "checks").text
    assert "answer" in checks and "answer.txt holds 42" in checks
    assert "+42" in chromium.find_element(By.ID, "diff").text


def test_eval_error_rollout_shows_its_reason(chromium: webdriver.Chrome, served: str) -> None:
    """Filtering the batch by status `eval_error` leaves the rollout whose evaluator
    broke; its page says why."""
    chromium.get(served)
    Select(chromium.find_element(By.NAME, "status")).select_by_visible_text("eval_error")
    chromium.find_element(By.CSS_SELECTOR, "form.filters button").click()
    links = chromium.find_elements(By.CSS_SELECTOR, "#rollouts a.rollout-link")
    assert [a.text for a in links] == ["r-err"]
    links[0].click()
    assert chromium.find_element(By.ID, "status").text == "eval_error"
    assert NOT_FOUND in chromium.find_element(By.ID, "reason").text


def test_script_in_an_agent_message_is_text(chromium: webdriver.Chrome, served: str) -> None:
    """The agent's `<script>` shows as text and does not run. Control: the same text
    as a page of its own does run (so the assertion would catch an unescaped page)."""
    chromium.get(served + "rollout/r-ok")
    text = chromium.find_element(By.ID, "tokens").text
    assert SCRIPT in text
    assert chromium.execute_script("return window.pwned === undefined")
    chromium.get("data:text/html," + SCRIPT.replace(" ", "%20"))
    assert chromium.execute_script("return window.pwned") == 1
