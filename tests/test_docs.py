"""The documentation's journeys run as written: every block a page marks `<!-- run -->`
(tests/docs_runner.py), in order, in a fresh folder, against real servers and real vLLM on loopback."""

from __future__ import annotations

import re
import time
from pathlib import Path

import polars as pl
import pytest
from docs_runner import REPOSITORY, run_pages, runnable_blocks, script

from otel_rl.query import query

DOCS = REPOSITORY / "docs"
PAGE_TIMEOUT_S = 600.0  # a shared 2-core machine under load: vLLM alone has taken 150 s to start


def run_journey(pages: list[Path], folder: Path, *, own_network: bool = True) -> str:
    """Run the pages' blocks in `folder`; their output (shown on failure)."""
    started = time.monotonic()
    result = run_pages(pages, folder, timeout_s=PAGE_TIMEOUT_S, own_network=own_network)
    took = time.monotonic() - started
    assert result.returncode == 0, (
        f"{[p.name for p in pages]} failed after {took:.0f} s:\n{result.stdout[-6000:]}"
    )
    starts = re.findall(r"## (\S+?):\d+ at (\d+) s", result.stdout)
    print(f"{' + '.join(p.name for p in pages)}: {took:.1f} s; pages start at {dict(reversed(starts))}")
    return result.stdout


def test_the_first_hour_as_written_traces_agents_exports_samples_and_trains(tmp_path: Path) -> None:
    """The quick start (model server, calculator agent, SQL), then in its folder the zero-code page, the
    gateway's APIs by hand, the samples export, a first offline run and the web view's data, as one reader
    would follow them."""
    pages = ("zero-code.md", "harnesses.md", "samples.md", "training.md", "ui.md")
    readme = REPOSITORY / "README.md"  # its block runs in the quick start's folder, as the README says
    output = run_journey([DOCS / "quickstart.md", readme, *(DOCS / page for page in pages)], tmp_path)
    db = [tmp_path / ".otel_rl" / "otel_rl.duckdb"]
    rollouts = query("SELECT rollout_id, status, n_calls FROM rollouts ORDER BY rollout_id", db=db)
    calculator = rollouts.filter(pl.col("rollout_id") != "r-0001")
    assert calculator.height == 1
    assert calculator["status"][0] == "ok" and calculator["n_calls"][0] >= 1
    calls = query(
        "SELECT rollout_id, len(prompt_token_ids) AS n_prompt, len(completion_token_ids[1]) AS n_completion"
        " FROM llm_calls",
        db=db,
    )
    # Through the gateway: the exact tokens of every call were recorded, the zero-code agent's call and the
    # two of harnesses.md's curl included.
    assert calls.height == calculator["n_calls"][0] + 1 + 2
    assert calls.filter(pl.col("rollout_id") == "r-0001").height == 1
    assert (calls["n_prompt"] > 0).all() and (calls["n_completion"] > 0).all()
    samples = pl.read_parquet(tmp_path / "samples.parquet")
    assert samples["rollout_id"].to_list() == calculator["rollout_id"].to_list()
    assert (samples["token_source"] == "exact").all()
    # What the pages say to expect: random weights retokenize badly, and the run says where it went.
    drift = re.search(r"drift\W+(\d+) of (\d+) calls differ", output)
    assert drift and int(drift[2]) > 0 and int(drift[1]) == int(drift[2]), output[-3000:]
    assert "run offline-" in output and "policy checkpoints: runs/first/step-2" in output
    assert re.search(r'\[\{"run_id":\s*"offline-[0-9a-f]{12}",\s*"steps":\s*2', output)  # ui.md's curl
    assert (tmp_path / "runs" / "first" / "step-2" / "model.safetensors").is_file()
    steps = query("SELECT count(*) AS n FROM spans WHERE name = 'otel_rl.train.step'", db=db)
    assert steps["n"][0] == 2  # the offline run's updates, recorded on the server for the web view


def test_the_coding_page_builds_validates_sandboxes_and_grades_as_written(tmp_path: Path) -> None:
    """docs/coding.md's "Try it": HumanEval built, one task validated, a command in the sandbox, a patch
    graded 1, with real bubblewrap and the grader's pytest (no server: the commands work on files)."""
    output = run_journey([DOCS / "coding.md"], tmp_path, own_network=False)
    assert '{"instance_id":"HumanEval__0","valid":true,"reasons":[]}' in output
    assert "/workspace ['.git', 'solution.py']" in output or "/workspace ['solution.py', '.git']" in output
    assert re.search(r'"outcome":"graded","reward":1\b', output), output[-3000:]
    assert len((tmp_path / "he.jsonl").read_text().splitlines()) == 164


def test_every_page_spells_the_otlp_header_as_the_otel_spec_does() -> None:
    """One spelling: the value percent-encoded (`Bearer%20<token>`), which every OTel SDK decodes."""
    pages = [REPOSITORY / "README.md", *sorted(DOCS.glob("*.md")), REPOSITORY / "examples" / "README.md"]
    for page in pages:
        for line in page.read_text().splitlines():
            if "OTEL_EXPORTER_OTLP_HEADERS" in line and "Bearer" in line:
                assert "authorization=Bearer%20" in line, f"{page.name}: {line}"


def test_every_run_marker_of_the_pages_opens_a_block_the_runner_can_run() -> None:
    pages = [REPOSITORY / "README.md", *sorted(DOCS.glob("*.md")), REPOSITORY / "examples" / "README.md"]
    marked = {page.name: runnable_blocks(page) for page in pages}
    assert marked["quickstart.md"], "the quick start has runnable blocks"
    for blocks in marked.values():
        assert "set -euo pipefail" in script(blocks, wait_s=1)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<!-- run -->\nno fence here\n", "must be followed by a fenced block"),
        ("<!-- run -->\n```bash\necho never closed\n", "never closed"),
        ("<!-- run: sleep 3 -->\n```bash\necho hi\n```\n", "unknown run option"),
        ("<!-- run -->\n```yaml\na: 1\n```\n", "cannot run a 'yaml' block"),
    ],
)
def test_a_run_marker_that_would_run_nothing_is_an_error(tmp_path: Path, text: str, error: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(ValueError, match=error):
        runnable_blocks(page)


def test_a_failing_block_stops_the_page_and_names_it(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- run -->\n```bash\nsleep 300 &\necho first\n```\n\n"
        "<!-- run -->\n```bash\nfalse\necho after\n```\n"
    )
    started = time.monotonic()
    result = run_pages([page], tmp_path / "run", timeout_s=60)
    assert result.returncode != 0
    assert "## page.md:8" in result.stdout and "first" in result.stdout and "after" not in result.stdout
    assert time.monotonic() - started < 30  # the background `sleep 300` was stopped with the page
