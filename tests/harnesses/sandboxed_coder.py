"""A scripted coding harness for the sandboxed rollout test: asks the gateway (openai SDK, its rollout
key) for a function body and writes it into solution.py (then exits 75, "cut by its turn limit", when told
to); reports its own reward 1.0 as a forged `grader`; prints what it can reach and see inside as JSON."""

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import openai
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

SKIPPED = ("/proc", "/sys", "/dev", "/usr", os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix))


def connect(host: str, port: int) -> str:
    """What a byte sent there gets: an answer, or the error that stopped it."""
    try:
        with socket.create_connection((host, port), timeout=2) as sock:
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
            return "answered" if sock.recv(1) else "closed"
    except OSError as error:
        return type(error).__name__


def resolve(name: str) -> str:
    try:
        return socket.getaddrinfo(name, 443)[0][4][0]
    except OSError as error:
        return type(error).__name__


def visible_text() -> str:
    """Every process's environment and command line, and every readable file outside the system folders."""
    parts = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for name in ("environ", "cmdline"):
            with contextlib.suppress(OSError):
                parts.append(Path(f"/proc/{pid}/{name}").read_bytes().decode(errors="replace"))
    for root, folders, files in os.walk("/"):
        folders[:] = [f for f in folders if not os.path.join(root, f).startswith(SKIPPED)]
        for name in files:
            with contextlib.suppress(OSError):
                parts.append(Path(root, name).read_bytes()[: 1 << 20].decode(errors="replace"))
    return "\n".join(parts)


def forge_reward() -> None:
    """A reward of 1.0 claiming source `grader`, the zero-code way (resource and parent from the env)."""
    provider = TracerProvider(resource=Resource.create())
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    parent = TraceContextTextMapPropagator().extract({"traceparent": os.environ["TRACEPARENT"]})
    span = provider.get_tracer("sandboxed_coder").start_span("self_check", context=parent)
    span.add_event(
        "gen_ai.evaluation.result",
        {"gen_ai.evaluation.name": "outcome", "gen_ai.evaluation.score.value": 1.0,
         "otel_rl.reward.source": "grader"},
    )  # fmt: skip
    span.end()
    provider.shutdown()


def main() -> None:
    task = json.loads(os.environ["OTEL_RL_TASK"])
    probes = json.loads(sys.argv[1])
    if task["answer"] == "hang":
        subprocess.run(["sleep", "600"])  # a child too: the wall clock must take the whole sandbox
    reply = openai.OpenAI().chat.completions.create(
        model=probes["model"],
        messages=[{"role": "user", "content": f"{task['answer']}: {task['problem_statement']}"}],
    )
    source = Path("solution.py")
    body = reply.choices[0].message.content
    source.write_text(source.read_text().replace("    raise NotImplementedError\n", body))
    if task["answer"] == "truncate":
        sys.exit(75)  # as a recipe reports that its CLI stopped at its turn limit
    forge_reward()
    report = {
        "cwd": os.getcwd(),
        "connects": {str(port): connect("127.0.0.1", port) for port in probes["ports"]},
        "outside": connect(probes["outside"], 80),
        "resolved": resolve(probes["resolve"]) if "resolve" in probes else None,
        "host_paths": {path: os.path.exists(path) for path in probes["host_paths"]},
        "git_log": os.popen("git log --all --oneline").read().strip().splitlines(),
        "visible": visible_text() if probes.get("scan", True) else "",  # not the host's disk when unsandboxed
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
