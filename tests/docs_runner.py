"""Runs the command blocks a documentation page marks as runnable, in order, in one shell in a fresh folder.

A page marks a fenced block runnable with an HTML comment on the line just before its opening fence
(docs/index.md, "Pages that run"):

    <!-- run -->                                      run the block (bash; a ```python block in python)
    <!-- run: wait http://127.0.0.1:4318/healthz -->  run it, then wait until the URL answers 200

Every runnable block of a page becomes one bash script run with `set -euo pipefail`, so a server a block
starts with `&` serves the blocks after it, and a failing command stops the page. Background commands are
stopped when the script ends. The script runs in its own network namespace (`unshare -rn`) when the
kernel allows one, so a page's default ports (4318, 4317) never meet another server on the machine.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!--\s*run(?::\s*(?P<options>.*?))?\s*-->\s*$")
FENCE = re.compile(r"^(?P<fence>```+)\s*(?P<lang>[\w-]*)\s*$")
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
MAX_PAGE_BYTES = 1_000_000  # a documentation page; anything larger is not one


@dataclass(frozen=True)
class Block:
    """One runnable block of a page: where it starts, its language, its text and what to wait for after it."""

    page: str
    line: int
    language: str
    text: str
    wait_url: str | None


def runnable_blocks(page: Path) -> list[Block]:
    """The blocks of `page` marked `<!-- run -->`, in page order; ValueError for a marker not followed by a
    fence, an unknown option or an unclosed block (a marker that runs nothing would let a page drift)."""
    if page.stat().st_size > MAX_PAGE_BYTES:
        raise ValueError(f"{page} is over {MAX_PAGE_BYTES} bytes: not a documentation page")
    lines = page.read_text().splitlines()
    blocks = []
    for index, line in enumerate(lines):
        marker = MARKER.match(line.strip())
        if not marker:
            continue
        where = f"{page.name}:{index + 1}"
        fence = FENCE.match(lines[index + 1]) if index + 1 < len(lines) else None
        if not fence:
            raise ValueError(f"{where}: a run marker must be followed by a fenced block")
        language = fence["lang"]
        if language not in SHELL_LANGUAGES | {"python"}:
            raise ValueError(f"{where}: cannot run a {language!r} block (bash or python)")
        end = next((j for j in range(index + 2, len(lines)) if lines[j].strip() == fence["fence"]), None)
        if end is None:
            raise ValueError(f"{where}: the block after the run marker is never closed")
        blocks.append(
            Block(
                page.name, index + 2, language, "\n".join(lines[index + 2 : end]), wait_option(marker, where)
            )
        )
    return blocks


def wait_option(marker: re.Match, where: str) -> str | None:
    options = (marker["options"] or "").split()
    if not options:
        return None
    if len(options) == 2 and options[0] == "wait" and options[1].startswith("http://"):
        return options[1]
    raise ValueError(f"{where}: unknown run option {marker['options']!r} (known: 'wait http://...')")


def script(blocks: list[Block], *, wait_s: float) -> str:
    """The bash script that runs `blocks` in order and stops their background commands at the end."""
    parts = [
        "set -euo pipefail",
        # Stop what the blocks left running (servers started with &), politely first: a server stops its vLLM.
        "trap 'kill $(jobs -p) 2>/dev/null || true; wait || true' EXIT",
    ]
    for block in blocks:
        # $SECONDS: the seconds since the script started, so a log shows each block's time.
        parts.append(f"echo {shlex.quote(f'## {block.page}:{block.line} at')} $SECONDS s >&2")
        if block.language == "python":
            parts.append(f"python - <<'OTEL_RL_DOCS_PYTHON'\n{block.text}\nOTEL_RL_DOCS_PYTHON")
        else:
            parts.append(block.text)
        if block.wait_url:
            url = shlex.quote(block.wait_url)
            failed = shlex.quote(f"{block.wait_url} never answered")
            probe = f"curl -sf --max-time 5 -o /dev/null {url}"
            parts.append(
                f"for _ in $(seq {int(wait_s)}); do {probe} && break; sleep 1; done; "
                f"{probe} || {{ echo {failed} >&2; exit 1; }}"
            )
    return "\n".join(parts) + "\n"


def isolated_network() -> list[str]:
    """The command prefix that runs a script in a network namespace of its own, or [] where there is none."""
    prefix = ["unshare", "-rn", "bash", "-c", 'ip link set lo up && exec "$@"', "netns"]
    if shutil.which("unshare") and shutil.which("ip"):
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return prefix
    return []


def run_pages(
    pages: list[Path], folder: Path, *, timeout_s: float, own_network: bool = True
) -> subprocess.CompletedProcess:
    """Run the runnable blocks of `pages`, in order, in `folder` (which holds a copy of `examples/`, as a
    clone does), with this checkout's environment first on PATH and no otel-rl token in the environment.
    `own_network=False` runs them as the caller: pages that open no port, such as bubblewrap's, which
    refuses to sandbox as the root of `unshare -r`'s namespace."""
    blocks = [block for page in pages for block in runnable_blocks(page)]
    if not blocks:
        raise ValueError(f"no runnable blocks in {[p.name for p in pages]}")
    shutil.copytree(
        REPOSITORY / "examples", folder / "examples", ignore=shutil.ignore_patterns("__pycache__")
    )
    (folder / "run.sh").write_text(script(blocks, wait_s=timeout_s * 0.6))
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OPENAI_"))}
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment.get('PATH', '')}"
    process = subprocess.Popen(
        [*(isolated_network() if own_network else []), "bash", "run.sh"],
        cwd=folder,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        output += f"\n(stopped after {timeout_s:.0f} s)"
    finally:
        stop_group(process.pid)
    return subprocess.CompletedProcess(process.args, process.returncode, output, None)


def stop_group(pgid: int) -> None:
    """Kill what is left of the script's process group (a server's children outlive a killed server)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
