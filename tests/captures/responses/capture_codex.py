"""Saves the Responses requests Codex CLI sends in one shell-tool round trip, as the gateway received them
(indented JSON), into `codex-<version>/turn<N>.json` beside this file, for tests/test_gateway_responses.py.

Codex runs `codex exec` against the gateway in front of the fake vLLM, which answers the first turn with a
call of Codex's shell tool and the second with text. Rerun it when the pinned Codex changes:

    .venv/bin/python tests/captures/responses/capture_codex.py
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/: the fake vLLM and the in-process server

from fake_vllm import FakeVLLM, Reply, ToolCall  # noqa: E402
from gateway_server import ADMIN_TOKEN, GatewayServer  # noqa: E402

from otel_rl.gateway import responses  # noqa: E402
from otel_rl.harnesses.codex import CODEX  # noqa: E402
from otel_rl.harnesses.install import install  # noqa: E402

TASK = "write hello to out.txt"


def shell_call(request: dict, index: int) -> Reply | str:
    """A call of Codex's shell tool (`exec_command` in 0.171), then a closing answer."""
    if request["messages"][-1]["role"] == "tool":
        return "Done."
    return Reply(tool_calls=(ToolCall("exec_command", {"cmd": "echo hello > out.txt"}),))


def main() -> None:
    codex = install(CODEX)
    received: list[bytes] = []
    translate = responses.chat_request

    def keep(body: dict) -> dict:
        received.append(orjson.dumps(body, option=orjson.OPT_INDENT_2))
        return translate(body)

    responses.chat_request = keep  # the gateway calls the module's function: each request passes here
    with tempfile.TemporaryDirectory() as tmp, FakeVLLM(shell_call) as fake:
        home, work = Path(tmp, "codex-home"), Path(tmp, "work")
        home.mkdir()
        work.mkdir()
        with GatewayServer(Path(tmp, "store.duckdb"), vllm=[fake.base_url]) as gateway:
            (home / "config.toml").write_text(
                f'model = "{fake.model}"\nmodel_provider = "otel_rl"\napproval_policy = "never"\n'
                'sandbox_mode = "danger-full-access"\n\n[model_providers.otel_rl]\nname = "otel-rl"\n'
                f'base_url = "{gateway.url}"\nwire_api = "responses"\nenv_key = "OTEL_RL_KEY"\n'
            )
            env = dict(os.environ, CODEX_HOME=str(home), OTEL_RL_KEY=ADMIN_TOKEN)
            argv = [str(codex), "exec", "--skip-git-repo-check", TASK]
            subprocess.run(argv, cwd=work, env=env, check=True, capture_output=True, timeout=300)
        if (work / "out.txt").read_text() != "hello\n":
            raise RuntimeError("Codex did not run its shell tool")
    folder = HERE / f"codex-{CODEX.version}"
    folder.mkdir(exist_ok=True)
    for turn, body in enumerate(received, 1):
        (folder / f"turn{turn}.json").write_bytes(body + b"\n")
    print(f"saved {len(received)} requests in {folder}")


if __name__ == "__main__":
    main()
