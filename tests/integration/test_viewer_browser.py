"""The viewer in a real browser, over a batch made through the real path: `rollout run`
on the Temporal dev server, a worker with local sandboxes, the Gateway and the scripted
engine (`failing_batch`, tests/fixtures/real_batch.py: one task passes, its prompt
holding a `<script>`; the other's check cannot run, an `eval_error`). `rollout view` is
served as a process and headless Chromium (Selenium) clicks through it as a person
would. Page-level cases: tests/unit/test_viewer_pages.py.
"""

from collections.abc import Iterator

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from devstack.browser import headless_chromium, rollout_view
from tests.fixtures.real_batch import MISSING, SCRIPT, RealBatch

pytestmark = [pytest.mark.integration, pytest.mark.needs("base_image")]


def navigate(driver: webdriver.Chrome, element: WebElement) -> None:
    """Click a link or button and wait until the next page has replaced this one."""
    page = driver.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(driver, 30).until(expected_conditions.staleness_of(page))


@pytest.fixture(scope="module")
def chromium() -> Iterator[webdriver.Chrome]:
    with headless_chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def served(failing_batch: RealBatch) -> Iterator[str]:
    """`rollout view` over the batch, with the worker's data dir and the model's tokenizer."""
    b = failing_batch
    args = (str(b.samples), "--artifacts", str(b.data_dir), "--tokenizer", str(b.model))
    with rollout_view(*args) as url:
        yield url


def test_batch_to_rollout_marks_trained_tokens(
    chromium: webdriver.Chrome, served: str, failing_batch: RealBatch
) -> None:
    """From the batch page a click opens the rollout; its sampled tokens (loss mask 1)
    are drawn differently from the prompt and tool results, and hovering one reads out
    its id, logprob and policy version."""
    rid = f"{failing_batch.batch_id}-arith-mul-0"
    chromium.get(served)
    navigate(chromium, chromium.find_element(By.LINK_TEXT, rid))
    assert chromium.current_url.endswith(f"/rollout/{rid}")
    trained = chromium.find_elements(By.CSS_SELECTOR, "#tokens span.tok.t")
    others = chromium.find_elements(By.CSS_SELECTOR, "#tokens span.tok:not(.t)")
    assert trained and others
    line = "border-bottom-style"
    assert trained[0].value_of_css_property(line) == "solid"
    assert others[0].value_of_css_property(line) == "none"
    readout = trained[0].get_attribute("title")
    assert " id " in readout and "logprob " in readout and "policy tiny-random-v0" in readout
    sampled = "".join(t.text for t in trained)
    assert "42" in sampled and "6 times 7" not in sampled  # the reply, not the prompt


def test_conversation_shows_what_the_protocol_carried(
    chromium: webdriver.Chrome, served: str, failing_batch: RealBatch
) -> None:
    """The rollout's conversation link shows each call as the agent's protocol carried
    it (examples/agent.py: two chat turns): the first with the system message and the
    task (its `<script>` as text), the second with only what the agent added, each with
    the model's reply."""
    chromium.get(f"{served}rollout/{failing_batch.batch_id}-arith-mul-0")
    navigate(chromium, chromium.find_element(By.ID, "conversation-link"))
    assert "view=conversation" in chromium.current_url
    first, second = chromium.find_elements(By.CSS_SELECTOR, "#conversation section.call")

    def said(call: WebElement, role: str) -> list[str]:
        return [e.text for e in call.find_elements(By.CSS_SELECTOR, f".role-{role} pre.content")]

    assert said(first, "system") == ["You are a careful agent. Answer briefly."]
    [task] = said(first, "user")
    assert "What is 6 times 7?" in task and SCRIPT in task
    assert said(second, "system") == []
    assert said(second, "user") == ["Check your answer and state it again."]
    assert said(first, "assistant") == said(second, "assistant") == ["42"]
    assert "finish stop" in first.find_element(By.TAG_NAME, "h3").text
    assert chromium.execute_script("return window.pwned === undefined")


def test_evaluation_shows_reward_and_check_detail(
    chromium: webdriver.Chrome, served: str, failing_batch: RealBatch
) -> None:
    """The rollout's evaluation tab shows its reward, each check with its verdict, and
    the artifacts found on the worker's disk."""
    chromium.get(f"{served}rollout/{failing_batch.batch_id}-arith-mul-0")
    navigate(chromium, chromium.find_element(By.ID, "evaluation-link"))
    assert chromium.find_element(By.ID, "reward").text == "1"
    checks = chromium.find_element(By.ID, "checks").text
    assert "file0 file True 1.0" in checks and "ok" in checks.split("file0", 1)[1]
    assert "evaluation.json" in chromium.find_element(By.ID, "artifacts").text


def test_eval_error_rollout_shows_its_reason(
    chromium: webdriver.Chrome, served: str, failing_batch: RealBatch
) -> None:
    """Filtering the batch by status `eval_error` leaves the rollout whose evaluator
    broke; its page says why, and its evaluation record on the worker's disk opens."""
    chromium.get(served)
    Select(chromium.find_element(By.NAME, "status")).select_by_visible_text("eval_error")
    navigate(chromium, chromium.find_element(By.CSS_SELECTOR, "form.filters button"))
    links = chromium.find_elements(By.CSS_SELECTOR, "#rollouts a.rollout-link")
    assert [a.text for a in links] == [f"{failing_batch.batch_id}-py-missing-0"]
    navigate(chromium, links[0])
    assert chromium.find_element(By.ID, "status").text == "eval_error"
    assert f"{MISSING}: not found" in chromium.find_element(By.ID, "reason").text
    navigate(chromium, chromium.find_element(By.ID, "evaluation-link"))
    assert "verdict error" in chromium.find_element(By.TAG_NAME, "main").text
    navigate(
        chromium, chromium.find_element(By.LINK_TEXT, "evaluation.json")
    )  # the worker's record
    assert f"{MISSING}: not found" in chromium.find_element(By.CSS_SELECTOR, "pre.log").text


def test_script_in_an_agent_message_is_text(
    chromium: webdriver.Chrome, served: str, failing_batch: RealBatch
) -> None:
    """The agent's `<script>` shows as text and does not run. Control: the same text
    as a page of its own does run (so the assertion would catch an unescaped page)."""
    chromium.get(f"{served}rollout/{failing_batch.batch_id}-arith-mul-0")
    text = chromium.find_element(By.ID, "tokens").text
    assert SCRIPT in text
    assert chromium.execute_script("return window.pwned === undefined")
    chromium.get("data:text/html," + SCRIPT.replace(" ", "%20"))
    assert chromium.execute_script("return window.pwned") == 1
