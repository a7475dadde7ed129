"""A harness for controller tests: does what its task says (succeed, fail, crash, hang); dumps its env."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator


def emit_span() -> None:
    """One span the zero-code way: exporter, resource and parent all from the environment."""
    provider = TracerProvider(resource=Resource.create())
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    parent = TraceContextTextMapPropagator().extract({"traceparent": os.environ["TRACEPARENT"]})
    provider.get_tracer("probe").start_span("probe.work", context=parent).end()
    provider.shutdown()


def main() -> None:
    task = json.loads(os.environ["OTEL_RL_TASK"])
    out = Path(task["out"])
    attempt = len(list(out.glob("env-*")))
    (out / f"env-{attempt}.json").write_text(json.dumps(dict(os.environ)))
    (out / f"niceness-{attempt}").write_text(str(os.nice(0)))
    behaviour = task["behaviour"]
    if behaviour == "crash_once":
        behaviour = "crash" if attempt == 0 else "ok"
    if behaviour == "ok":
        emit_span()
        print("argv:", json.dumps(sys.argv[1:]))
    elif behaviour == "fail":
        sys.exit(3)
    elif behaviour == "crash":
        os.kill(os.getpid(), signal.SIGABRT)
    elif behaviour == "hang":
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        (out / f"grandchild-{attempt}.pid").write_text(str(grandchild.pid))
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the controller's SIGKILL can end this
        time.sleep(600)


if __name__ == "__main__":
    main()
