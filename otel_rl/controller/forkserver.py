"""A pre-importing fork server for Python harnesses: each rollout is a forked process that starts warm.

Starting `python harness.py` costs seconds of CPU before the first model call (importing `openai` and an
instrumentation), which on a laptop bounds rollouts to about one a second. This server imports the heavy
modules once; the controller then asks it for each attempt, and it forks a child that becomes the
harness: its own process and process group, the attempt's environment, stdout/stderr into the attempt's
log, the script run as `__main__` with its arguments. One JSON line a message on stdin/stdout:

    controller → server  {"id": 1, "argv": ["python", "agent.py"], "env": {...}, "log": "a.log", "nice": 0}
    server → controller  {"ready": true}            once the modules are imported
                         {"id": 1, "pid": 4242}     the child runs (or {"id": 1, "error": "..."})
                         {"pid": 4242, "exit": 0}   it ended: its exit status, -N when killed by signal N

The controller runs it as `python -c "<SERVE>" MODULE...` with the harness's own interpreter.
"""

import asyncio
import atexit
import contextlib
import json
import os
import runpy
import selectors
import signal
import sys
import traceback
import typing
from asyncio.subprocess import PIPE
from collections.abc import Mapping, Sequence
from importlib import import_module
from pathlib import Path
from typing import Any, NoReturn

SERVE = "import sys; from otel_rl.controller.forkserver import serve; serve(sys.argv[1:])"


def python_target(argv: Sequence[str]) -> tuple[str, str, list[str]]:
    """("path", script, args) for `python script.py args`, ("module", name, args) for `python -m name args`.
    Raises ValueError for any other command: only Python harnesses can be forked warm."""
    if len(argv) < 2 or not os.path.basename(argv[0]).startswith("python"):
        raise ValueError(f"preload needs a `python SCRIPT ...` or `python -m MODULE ...` harness: {argv}")
    if argv[1] == "-m":
        if len(argv) < 3:
            raise ValueError(f"`python -m` without a module name: {argv}")
        return "module", argv[2], list(argv[3:])
    if argv[1].startswith("-"):
        raise ValueError(f"preload: interpreter options are not supported: {argv}")
    return "path", argv[1], list(argv[2:])


def preload(modules: Sequence[str]) -> None:
    """Import the modules; with otel_rl among them, also everything `otel_rl.instrument()` imports; with
    openai, also what a harness's first OpenAI call would build."""
    for name in modules:
        import_module(name)
    if any(name == "otel_rl" or name.startswith("otel_rl.") for name in modules):
        from otel_rl.sdk.setup import warm_up

        warm_up()
    if "openai" in modules:
        warm_up_openai()


def warm_up_openai() -> None:
    """Build once what each harness would build on its first OpenAI call: the client's HTTP stack, the
    resources it imports on first access, and the validators of the response models, which openai defers
    to first use (pydantic `defer_build`). Measured: a calculator rollout forked warm took 110-120 ms of
    CPU instead of 140-160."""
    import openai
    from openai.types import Completion, Model
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    client = openai.OpenAI(api_key="warm-up", base_url="http://127.0.0.1/v1")
    client.chat.completions, client.completions, client.models  # noqa: B018 - imported on first access
    client.close()
    for model in models_within((ChatCompletion, ChatCompletionChunk, Completion, Model)):
        model.model_rebuild(raise_errors=False)


def models_within(roots: Sequence[type]) -> set[type]:
    """The pydantic models `roots` are made of: themselves and, recursively, those of their fields."""
    import pydantic

    found: set[type] = set()
    todo = list(roots)
    while todo:
        model = todo.pop()
        if model in found:
            continue
        found.add(model)
        annotations = [field.annotation for field in model.model_fields.values()]
        while annotations:
            annotation = annotations.pop()
            annotations += typing.get_args(annotation)
            if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
                todo.append(annotation)
    return found


def run_child(argv: Sequence[str], env: dict[str, str], log_path: str) -> NoReturn:
    """In the forked child: become the harness process, run it, exit with its status (never returns)."""
    os.setsid()  # its own process group: the controller's timeout kills the group
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # not the server's request pipe
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(env)
    kind, target, args = python_target(argv)
    sys.argv = [target, *args]
    code = 0
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python script.py` sets it
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exit_:
        code = exit_code(exit_.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    # os._exit skips interpreter shutdown, so run what it would: the OTel SDK exports its spans at exit.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def exit_code(code: Any) -> int:
    """The process exit status for `sys.exit(code)`, as the interpreter computes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def serve(modules: Sequence[str]) -> None:
    """Preload, then fork a child per request until stdin closes."""
    preload(modules)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    send({"ready": True})
    pending = b""
    while True:
        for key, _ in selector.select():
            if key.fd == 0:
                # Raw reads: a buffered readline could hold a second request that select() then never sees.
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    return
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    spawn(json.loads(line), selector)
            else:  # a pidfd: that child has ended
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(key.data, 0)
                send({"pid": key.data, "exit": os.waitstatus_to_exitcode(status)})


def spawn(request: dict[str, Any], selector: selectors.BaseSelector) -> None:
    try:
        python_target(request["argv"])
        pid = os.fork()
    except (ValueError, OSError) as error:
        send({"id": request["id"], "error": str(error)})
        return
    if pid == 0:
        try:
            for key in list(selector.get_map().values()):  # the siblings' pidfds
                if key.fd != 0:
                    os.close(key.fd)
            selector.close()
            os.nice(request["nice"])
            run_child(request["argv"], request["env"], request["log"])
        finally:
            os._exit(70)  # run_child failed before the harness ran: never return into the server loop
    selector.register(os.pidfd_open(pid), selectors.EVENT_READ, pid)
    send({"id": request["id"], "pid": pid})


def _kill(pid: int) -> None:
    """Kill a forked child and its process group (which it may not have made yet)."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError):
            kill(pid, signal.SIGKILL)


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class Forked:
    """A harness process forked by the server, with the parts of asyncio's Process the controller uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def _exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set_result(code)

    def _lost(self, error: Exception) -> None:
        if not self._exited.done():
            self._exited.set_exception(error)


class ForkServer:
    """The controller's side: starts the server (with the harness's own interpreter) on first use, in the
    running event loop, and restarts it if it died."""

    def __init__(self, python: str, modules: Sequence[str], env: Mapping[str, str], log_path: Path) -> None:
        self._command = [python, "-c", SERVE, *modules]
        self._env = dict(env)
        self._log_path = log_path
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._starting = asyncio.Lock()
        self._next_id = 0
        self._spawning: dict[int, asyncio.Future[Forked]] = {}
        self._running: dict[int, Forked] = {}

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, nice: int) -> Forked:
        """Fork one harness process (at scheduling priority `nice`); returns once it runs."""
        process = await self._started()
        self._next_id += 1
        spawned = asyncio.get_running_loop().create_future()
        self._spawning[self._next_id] = spawned
        request = {"id": self._next_id, "argv": list(argv), "env": dict(env), "log": str(log_path)}
        request["nice"] = nice
        process.stdin.write(json.dumps(request).encode() + b"\n")
        await process.stdin.drain()
        return await spawned

    async def stop(self) -> None:
        """End the server (not its children: each attempt's process group is the controller's to end)."""
        if self._process is None:
            return
        self._process.stdin.close()  # the server exits at the end of its requests
        try:
            async with asyncio.timeout(5):
                await self._process.wait()
        except TimeoutError:
            self._process.kill()
            await self._process.wait()
        if self._reader is not None:
            await self._reader
        self._process = self._reader = None

    async def _started(self) -> asyncio.subprocess.Process:
        async with self._starting:
            if self._process is None or self._process.returncode is not None:
                with self._log_path.open("ab") as log:
                    self._process = await asyncio.create_subprocess_exec(
                        *self._command, env=self._env, stdin=PIPE, stdout=PIPE, stderr=log
                    )
                ready = await self._process.stdout.readline()
                if not ready:
                    await self._process.wait()
                    raise RuntimeError(f"the fork server did not start; see {self._log_path}")
                self._reader = asyncio.create_task(self._read(self._process))
            return self._process

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        while line := await process.stdout.readline():
            message = json.loads(line)
            if "exit" in message:
                self._running.pop(message["pid"])._exit(message["exit"])
                continue
            spawned = self._spawning.pop(message["id"])
            if "error" in message:
                if not spawned.cancelled():
                    spawned.set_exception(RuntimeError(message["error"]))
                continue
            forked = self._running[message["pid"]] = Forked(message["pid"])
            if spawned.cancelled():
                # Its attempt was cancelled while the child was forked: nothing else knows it, so end it here
                # (its exit message still comes, above).
                _kill(forked.pid)
            else:
                spawned.set_result(forked)
        lost = RuntimeError(f"the fork server exited; see {self._log_path}")
        for spawned in self._spawning.values():
            if not spawned.cancelled():
                spawned.set_exception(lost)
        for forked in self._running.values():
            forked._lost(lost)
        self._spawning.clear()
        self._running.clear()
