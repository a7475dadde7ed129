"""The scripted expert harness: the calculator agent, many rollouts in one process, against a scripted model.

The demo's stage 1 needs traces of a noisy expert to fine-tune the starting policy on. Here the harness is
the real calculator agent (`calc_agent.solve`, the official openai client, `otel_rl.instrument()`), and the
model behind its OpenAI endpoint is a script, `calc_task.expert_reply`, served over HTTP on a loopback port by
a tiny OpenAI-compatible chat-completions server started in this process. So the traces in the store are
what a real harness calling a real model produces, and the SFT data comes from them like any other.

    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python examples/expert_agent.py --tasks tasks.jsonl

One process runs all the tasks (one `otel_rl.rollout()` each): starting a process per rollout would cost more
than the whole scripted rollout.
"""

import argparse
import json
import random
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

from calc_agent import solve  # the calculator agent, beside this file
from calc_task import check, expert_reply
from openai import OpenAI

import otel_rl

MODEL = "scripted-expert"


def completion(reply: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion response body carrying one scripted assistant message."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": reply,
                "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def expert_server(seed: int) -> HTTPServer:
    """An OpenAI-compatible server on a free loopback port whose model is the noisy scripted expert."""
    rng = random.Random(seed)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects
        disable_nagle_algorithm = True  # headers and body go out in two writes: no 20-40 ms delayed-ACK stall

        def do_GET(self) -> None:
            if self.path.rstrip("/") != "/v1/models":
                return self.send_json(404, {"error": {"message": f"no route {self.path}"}})
            self.send_json(
                200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "me"}]}
            )

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path.rstrip("/") != "/v1/chat/completions":
                return self.send_json(404, {"error": {"message": f"no route {self.path}"}})
            self.send_json(200, completion(expert_reply(body["messages"], rng)))

        def send_json(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:  # one line per request would drown the demo's output
            pass

    return HTTPServer(("127.0.0.1", 0), Handler)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=Path, required=True, help="tasks JSONL (examples/calc_task.py)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the expert's noise")
    args = parser.parse_args()
    tasks = [json.loads(line) for line in args.tasks.read_text().splitlines() if line.strip()]

    telemetry = otel_rl.instrument()
    server = expert_server(args.seed)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = OpenAI(base_url=f"http://127.0.0.1:{server.server_port}/v1", api_key="scripted")
    rewards = []
    for task in tasks:
        with otel_rl.rollout(task_id=task.get("id"), split=task.get("split")) as r:
            final, used_tool = solve(client, MODEL, task["question"], temperature=1.0)
            rewards.append(check(task, final, used_tool))
            r.reward(rewards[-1], explanation=f"final message {final!r}; calc used: {used_tool}")
    telemetry.force_flush()
    client.close()  # ends the keep-alive connection that the single-threaded server is serving
    server.shutdown()
    print(json.dumps({"rollouts": len(rewards), "mean_reward": sum(rewards) / max(1, len(rewards))}))


if __name__ == "__main__":
    main()
