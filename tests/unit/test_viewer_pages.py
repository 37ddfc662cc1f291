"""The viewer's pages over samples written by the real writer, through Starlette's
TestClient: what each page shows, paging, filters, bad input and hostile text. The
same pages in a real browser: tests/integration/test_viewer_browser.py."""

import re
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

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
from rollout_client.samples_reader import NotASamplesDirectoryError, SamplesReader
from rollout_client.storage import write_table
from schemas.routing import RoutedExperts
from schemas.samples import SAMPLE_ARROW_SCHEMA, rows_to_table
from tests.unit.test_schemas import V4_COLUMNS, as_version
from viewer.app import BATCH_ROWS, viewer_app
from viewer.conversation import PAGE_CALLS
from viewer.conversation import TEXT_CHARS as CONV_TEXT_CHARS
from viewer.tokens import PAGE_TOKENS, load_tokenizer

HOSTILE = "<script>window.pwned = 1</script><b>bold?</b>\x1b[31mred\x07"


@pytest.fixture()
def batch(tmp_path: Path) -> tuple[Path, Path]:
    out, data = tmp_path / "b1", tmp_path / "worker"
    out.mkdir()
    failed = eval_error("sh: 1: python: not found")
    write_rollout(out, rollout_rows("r-ok", "add", reward=1.0))
    write_rollout(out, rollout_rows("r-zero", "add", reward=0.0, seed=1))
    write_rollout(
        out,
        rollout_rows(
            "r-err",
            "mul",
            reward=0.0,
            status="infra_error",
            rollout_status="eval_error",
            status_reason="check 'tests' could not run: python: not found",
            evaluation=failed,
        ),
    )
    write_artifacts(data, "r-ok", passed_evaluation(), "--- a/x\n+++ b/x\n+42\n", "agent said hi\n")
    write_artifacts(data, "r-err", failed, "", "agent said bye\n")
    write_manifest(
        out,
        "b1",
        [
            result("r-ok", "add", "ok", 1.0),
            result("r-zero", "add", "ok", 0.0),
            result("r-err", "mul", "eval_error", None, error="python: not found"),
            {"rollout_id": "r-lost", "workflow_status": "FAILED", "error": "worker lost"},
        ],
    )
    return out, data


def client(out: Path, artifacts: Path | None = None, **kw: object) -> TestClient:
    app = viewer_app(SamplesReader(out, artifacts), **kw)  # type: ignore[arg-type]
    return TestClient(app, base_url="http://localhost")


def rows_of(html: str, table_id: str) -> list[str]:
    body = html.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]
    return re.findall(r"<tr.*?</tr>", body, flags=re.S)[1:]


def test_batch_lists_every_rollout_with_tokens_and_status_counts_per_task(batch) -> None:
    out, _ = batch
    html = client(out).get("/").text
    rows = rows_of(html, "rollouts")
    assert [re.search(r'href="/rollout/([^"]+)"', r)[1] for r in rows] == [
        "r-err",
        "r-lost",
        "r-ok",
        "r-zero",
    ]
    ok_row = next(r for r in rows if "/rollout/r-ok" in r)
    # 3 calls × 10 sampled + 1 compaction call × 10: 40 trained of 80 response tokens
    assert re.findall(r"<td>(\d+)</td>", ok_row)[:6] == ["1", "2", "4", "60", "80", "40"]
    assert "eval_error" in next(r for r in rows if "/rollout/r-err" in r)
    assert "worker lost" in next(r for r in rows if "/rollout/r-lost" in r)
    lost = client(out).get("/rollout/r-lost").text  # in the manifest only: no samples
    assert "worker lost" in lost and "This rollout left no samples." in lost
    assert client(out).get("/rollout/r-lost/lineage").status_code == 200
    assert 'value="1"></meter></td><td>1</td>' in html.split("<h3>mul", 1)[1].split("</section>")[0]


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ("status=eval_error", ["r-err"]),
        ("task=add", ["r-ok", "r-zero"]),
        ("min_reward=0.5", ["r-ok"]),
        ("task=add&max_reward=0.5", ["r-zero"]),
    ],
)
def test_batch_filters(batch, query: str, shown: list[str]) -> None:
    out, _ = batch
    rows = rows_of(client(out).get(f"/?{query}").text, "rollouts")
    assert [re.search(r'href="/rollout/([^"]+)"', r)[1] for r in rows] == shown


def test_rollout_marks_trained_tokens_with_logprob_and_version_readout(batch) -> None:
    out, _ = batch
    tok = load_tokenizer(ensure_tiny_model())
    html = client(out, tokenizer=tok).get("/rollout/r-ok").text
    spans = re.findall(r'<span class="tok( t h\d)?" title="([^"]*)">', html.split('id="tokens"')[1])
    trained = [title for cls, title in spans if cls]
    assert len(spans) == 30 + 60 and len(trained) == 30
    row = rollout_rows("r-ok", "add", reward=1.0)[0]
    first = row.response_ids[0]
    want = f"#30 id {first} · {tok.decode([first], skip_special_tokens=False)!r}"
    assert trained[0].startswith(want.replace("'", "&#39;"))
    assert f"logprob {row.logprobs[0]:.4f} · policy v0" in trained[0]
    assert "policy v1" in trained[-1]  # the later calls were sampled by v1
    assert "call 3 of 3 · policy v1" in html
    assert "compaction" in html and "continues r-ok-s0" in html


def test_large_rollout_is_paged(tmp_path: Path) -> None:
    rows = rollout_rows("r-big", "t", calls=200, tokens_per_call=500, prompt_tokens=1000)
    write_rollout(tmp_path, rows)
    c = client(tmp_path)
    first = c.get("/rollout/r-big").text
    total = 1000 + 200 * 500
    pages = -(-total // PAGE_TOKENS)
    assert (
        first.count('<span class="tok') - first.split('id="tokens"')[0].count('<span class="tok')
        == PAGE_TOKENS
    )
    assert f"page 1 of {pages}" in first and 'rel="next"' in first
    last = c.get(f"/rollout/r-big?segment=r-big-s0&page={pages - 1}").text
    assert f"page {pages} of {pages}" in last and 'rel="next"' not in last
    assert "call 200 of 200" in last


def test_conversation_shows_each_calls_messages_tool_calls_and_results(batch) -> None:
    """The conversation view, a plain link from the rollout page, shows per call what
    the protocol carried: the task, the reply's folded reasoning and its tool call with
    pretty arguments, then the tool's result and the final words."""
    out, _ = batch
    c = client(out)
    rollout = c.get("/rollout/r-ok").text
    link = re.search(r'<a href="([^"]+)" id="conversation-link"', rollout)[1]
    html = c.get("/rollout/r-ok" + link.replace("&amp;", "&")).text
    shown = html.split('id="conversation"', 1)[1]
    calls = re.findall(r'<section class="call" id="call-(\d+)">', shown)
    assert calls == ["1", "2", "3"]
    first, second, last = shown.split('<section class="call"')[1:]
    assert "Fix the failing test." in first and "You are a coding agent." in first
    assert '<details class="reasoning"><summary>reasoning</summary><pre>Step 0' in first
    assert "calls <b>bash</b> <small>call-0</small>" in first
    assert '<pre class="arguments">{\n  &#34;command&#34;: &#34;ls&#34;\n}</pre>' in first
    assert "tool result for call-0" in second and "file1.py" in second
    assert "policy v1" in last and "The tests pass now." in last


def test_conversation_of_a_large_rollout_is_paged_by_calls(tmp_path: Path) -> None:
    write_rollout(tmp_path, rollout_rows("r-big", "t", calls=200))
    c = client(tmp_path)
    first = c.get("/rollout/r-big?view=conversation").text
    assert first.count('<section class="call"') == PAGE_CALLS
    assert f"calls 1–{PAGE_CALLS} of 200" in first and 'rel="next"' in first
    pages = -(-200 // PAGE_CALLS)
    last = c.get(f"/rollout/r-big?segment=r-big-s0&view=conversation&page={pages - 1}").text
    assert 'id="call-200"' in last and 'rel="next"' not in last


def test_a_hostile_agent_message_in_the_conversation_stays_text(tmp_path: Path) -> None:
    """Control: the same text as the status reason shows escaped too (the check would see
    a raw `<script` in the page, `test_hostile_text_is_escaped_and_clipped`)."""
    huge = "y" * 50_000
    write_rollout(tmp_path, rollout_rows("r-bad", "t", last_words=HOSTILE + huge))
    html = client(tmp_path).get("/rollout/r-bad?view=conversation").text
    assert "<script" not in html.lower()
    assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;&lt;b&gt;bold?&lt;/b&gt;" in html
    assert "\\x1b[31mred\\x07" in html and "\x1b" not in html
    assert f"[… {len(HOSTILE) + len(huge) - CONV_TEXT_CHARS:,} characters clipped]" in html


def test_evaluation_shows_checks_diff_and_logs(batch) -> None:
    out, data = batch
    html = client(out, data).get("/rollout/r-ok/evaluation").text
    checks = rows_of(html, "checks")
    assert len(checks) == 1 and "answer.txt holds 42" in checks[0] and 'class="pass"' in checks[0]
    assert "+42" in html.split('id="diff"')[1] and "agent said hi" in html
    log = client(out, data).get("/rollout/r-ok/artifact/logs/agent.log").text
    assert "agent said hi" in log


def test_eval_error_rollout_shows_its_reason(batch) -> None:
    out, data = batch
    c = client(out, data)
    for path in ("/rollout/r-err", "/rollout/r-err/evaluation"):
        html = c.get(path).text
        assert '<b class="status st-eval_error" id="status">eval_error</b>' in html
        assert "python: not found" in html.split('id="reason"')[1].split("</pre>")[0]
    checks = rows_of(c.get("/rollout/r-err/evaluation").text, "checks")
    assert "sh: 1: python: not found" in checks[0] and "<td>127</td>" in checks[0]


def test_missing_artifacts_are_shown_as_missing(batch) -> None:
    out, data = batch
    html = client(out).get("/rollout/r-ok/evaluation").text
    assert "diff.patch: not looked (give --artifacts" in html
    assert "answer.txt holds 42" in html  # the checks travel with the samples
    html = client(out, data).get("/rollout/r-zero/evaluation").text
    assert "diff.patch: missing" in html
    assert [r.count("<td>missing</td>") for r in rows_of(html, "artifacts")] == [1, 1, 1]
    assert client(out, data).get("/rollout/r-ok/artifact/../../etc/passwd").status_code == 404


def test_lineage_shows_every_field_but_tokens(batch) -> None:
    out, _ = batch
    html = client(out).get("/rollout/r-ok/lineage").text
    names = re.findall(r"<tr><th>([a-z_]+)</th>", html.split("<tbody>")[1])
    tokens = {"prompt_ids", "response_ids", "loss_mask", "logprobs"}
    assert set(names) == set(SAMPLE_ARROW_SCHEMA.names) - tokens
    assert "v0 ×1, v1 ×2" in html and "jsonl:tasks.jsonl" in html
    assert "evaluation.json, diff.patch, logs/agent.log" in html


def test_hostile_text_is_escaped_and_clipped(tmp_path: Path) -> None:
    huge = "x" * 3_000_000
    write_rollout(
        tmp_path,
        rollout_rows("r-bad", "t", status="infra_error", status_reason=HOSTILE + huge),
    )
    reply = client(tmp_path).get("/rollout/r-bad")
    html = reply.text
    assert "<script" not in html.lower()
    assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;&lt;b&gt;bold?&lt;/b&gt;" in html
    assert "\\x1b[31mred\\x07" in html and "\x1b" not in html
    assert "characters clipped" in html and len(html) < 200_000
    assert "script-src" not in reply.headers["content-security-policy"]
    assert "default-src 'none'" in reply.headers["content-security-policy"]


def test_older_schema_opens(tmp_path: Path) -> None:
    v1_drop = ["call_policy_versions", "call_starts", "call_sampling", *V4_COLUMNS]
    table = as_version(rows_to_table(rollout_rows("r-old", "t")), 1, v1_drop)
    write_table(table, str(tmp_path / "r-old.parquet"))
    c = client(tmp_path)
    assert "/rollout/r-old" in c.get("/").text
    html = c.get("/rollout/r-old").text
    assert "call 1 of 1" in html and 'class="tok t' in html
    assert "Written by an older samples schema: no task source" in html
    said = c.get("/rollout/r-old?view=conversation").text
    assert "These samples record no conversation" in said
    assert "No checks recorded (older samples schema)" in c.get("/rollout/r-old/evaluation").text
    assert c.get("/rollout/r-old/lineage").status_code == 200


def test_unreadable_file_is_listed_and_the_rest_shows(batch) -> None:
    out, _ = batch
    (out / "r-broken.parquet").write_bytes(b"not parquet")
    html = client(out).get("/").text
    assert "r-broken.parquet" in html.split("Unreadable files")[1]
    assert "/rollout/r-ok" in html
    broken = client(out).get("/rollout/r-broken")
    assert broken.status_code == 404 and "r-broken" in broken.text


def test_not_a_samples_dir_is_refused_with_what_was_expected(tmp_path: Path, batch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NotASamplesDirectoryError, match=r"expected <rollout_id>.parquet"):
        SamplesReader(empty)


def test_out_dir_with_several_batches_lists_them(tmp_path: Path, batch) -> None:
    other = tmp_path / "b2"
    other.mkdir()
    write_rollout(other, rollout_rows("r-two", "add", batch_id="b2"))
    c = client(tmp_path)
    assert re.findall(r'href="/batch/([^"]+)"', c.get("/").text) == ["b1", "b2"]
    assert "/rollout/r-two" in c.get("/batch/b2").text
    assert "/rollout/r-ok" in c.get("/batch/b1").text
    assert "wrote no" not in c.get("/rollout/r-two").text
    assert c.get("/batch/b3").status_code == 404


def test_token_is_required_when_set(batch) -> None:
    out, _ = batch
    c = client(out, token="s3cret")
    assert c.get("/").status_code == 401
    assert c.get("/?token=wrong").status_code == 401
    reply = c.get("/rollout/r-ok?token=s3cret&segment=r-ok-s1", follow_redirects=False)
    assert reply.status_code == 303 and reply.headers["location"] == "/rollout/r-ok?segment=r-ok-s1"
    assert c.get("/").status_code == 200  # the cookie


def test_foreign_host_header_is_refused(batch) -> None:
    out, _ = batch
    c = client(out, allowed_hosts=["localhost", "127.0.0.1"])
    assert c.get("/").status_code == 200
    assert c.get("/", headers={"host": "evil.example"}).status_code == 400


def test_unknown_rollout_is_a_404_page(batch) -> None:
    out, _ = batch
    c = client(out)
    assert c.get("/rollout/nope").status_code == 404
    assert c.get("/rollout/..%2F..").status_code == 404


def test_batch_table_is_paged(tmp_path: Path) -> None:
    for i in range(BATCH_ROWS + 5):
        write_rollout(tmp_path, rollout_rows(f"r-{i:04d}", "t", calls=1, seed=i))
    c = client(tmp_path)
    first = c.get("/?task=t").text
    assert len(rows_of(first, "rollouts")) == BATCH_ROWS
    assert f"{BATCH_ROWS + 5} matching · page 1 of 2" in first
    second = c.get("/?task=t&page=1").text
    assert [re.search(r'href="/rollout/([^"]+)"', r)[1] for r in rows_of(second, "rollouts")] == [
        f"r-{i:04d}" for i in range(BATCH_ROWS, BATCH_ROWS + 5)
    ]


def test_a_changed_batch_is_read_again(batch) -> None:
    out, _ = batch
    c = client(out)
    assert "/rollout/r-new" not in c.get("/").text
    write_rollout(out, rollout_rows("r-new", "add"))
    assert "/rollout/r-new" in c.get("/").text


def test_lineage_shows_routed_experts_by_shape_not_bytes(tmp_path: Path) -> None:
    out = tmp_path / "b1"
    out.mkdir()
    rows = []
    for r in rollout_rows("r-moe", "add"):
        tokens = len(r.prompt_ids) + len(r.response_ids) - 1
        ids = np.full((tokens, 3, 2), 200)
        rows.append(r.model_copy(update={"routed_experts": RoutedExperts.of(ids)}))
    write_rollout(out, rows)
    html = client(out).get("/rollout/r-moe/lineage").text
    assert f"{tokens} tokens x 3 layers x 2 experts, uint8" in html
    assert "data=" not in html and "\\xc8" not in html
