"""The sandbox a coding agent works in: real bubblewrap over a real one-commit workspace."""

import http.server
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from coding_tasks import calc_task_file, humaneval_task_file

from otel_rl.coding import sandbox
from otel_rl.coding.tasks import load_tasks
from otel_rl.coding.workspace import make_workspace

OTEL_RL = str(Path(sys.executable).with_name("otel-rl"))
SMALL = sandbox.Limits(
    cpu_seconds=5, memory_bytes=512 << 20, processes=32, file_bytes=1 << 20, wall_seconds=20
)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    task_set = load_tasks(calc_task_file(tmp_path))
    work = make_workspace(task_set, task_set.tasks[0], tmp_path / "work")
    sandbox.hand_over(work)
    return work


def run(workspace: Path, script: str, limits: sandbox.Limits = SMALL) -> sandbox.Completed:
    return sandbox.run(workspace, ["sh", "-c", script], limits=limits)


def test_the_workspace_is_one_commit_of_the_base_without_the_future_fix(workspace: Path) -> None:
    done = run(
        workspace, "git log --all --oneline | wc -l; git grep -c FUTURE-FIX-MARKER $(git rev-list --all)"
    )
    assert done.stdout.decode().split()[0] == "1"
    assert b"FUTURE-FIX-MARKER" not in done.stdout
    assert (workspace / "calc" / "__init__.py").read_text().count("a - b") == 1


def test_host_temp_and_home_and_the_task_files_are_not_visible(workspace: Path, tmp_path: Path) -> None:
    marker = tmp_path / "host-secret.txt"
    marker.write_text("secret")
    host_home = Path.home()
    # The sandbox binds the Python environments read-only at their paths: the folders down to them show
    # (a checkout under /tmp, as a CI clone may be, shows its first folder in /tmp), nothing else does.
    python_ancestors = {
        p.name for prefix in (sys.prefix, sys.base_prefix) for p in Path(os.path.realpath(prefix)).parents
    }
    done = run(
        workspace, f"cat {marker}; cat {tmp_path / 'tasks.jsonl'}; ls -A /tmp; echo; ls -A {host_home}"
    )
    assert b"secret" not in done.stdout and b"test_add_zero" not in done.stdout
    lines = done.stdout.decode().split("\n")
    assert set(lines[0].split()) <= python_ancestors  # /tmp inside holds nothing of the host's /tmp
    inside_home = set(lines[1].split())
    assert inside_home <= python_ancestors  # only the path down to the Python environment, nothing else
    assert set(os.listdir(host_home)) - python_ancestors, "the host home has entries to hide"


def test_no_network_a_host_loopback_port_is_unreachable(workspace: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[object] = []
    acceptor = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
    acceptor.start()
    probe = f"""
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=3)
    print("connected")
except OSError as error:
    print(type(error).__name__)
"""
    done = sandbox.run(workspace, ["python", "-c", probe], limits=SMALL)
    assert done.stdout.strip() == b"ConnectionRefusedError"
    socket.create_connection(("127.0.0.1", port), timeout=3).close()  # the control: reachable from the host
    acceptor.join(timeout=10)  # the accept returns once the control connected: wait for it, not a race
    listener.close()
    assert len(accepted) == 1


def test_root_is_read_only_and_the_workspace_is_writable(workspace: Path) -> None:
    done = run(
        workspace,
        "touch /usr/x 2>/dev/null || echo ro; touch new && echo rw; grep NoNewPrivs /proc/self/status",
    )
    assert done.stdout.split() == [b"ro", b"rw", b"NoNewPrivs:", b"1"]
    assert (workspace / "new").exists()


def test_a_fork_bomb_is_cut_by_the_process_limit(workspace: Path) -> None:
    bomb = """
import os, time
forks = 0
for _ in range(200):
    try:
        pid = os.fork()
    except BlockingIOError:
        break
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    forks += 1
print(forks)
"""
    done = sandbox.run(workspace, ["python", "-c", bomb], limits=SMALL)
    assert 0 < int(done.stdout) < SMALL.processes


def test_a_memory_hog_is_cut_by_the_memory_limit(workspace: Path) -> None:
    done = sandbox.run(workspace, ["python", "-c", "x = bytearray(2 << 30)"], limits=SMALL)
    assert done.returncode != 0 and b"MemoryError" in done.stderr


def test_an_infinite_loop_is_cut_by_the_cpu_limit(workspace: Path) -> None:
    limits = sandbox.Limits(cpu_seconds=1, wall_seconds=20)
    done = sandbox.run(workspace, ["python", "-c", "while True: pass"], limits=limits)
    assert done.returncode not in (0, None) and done.seconds < 10


def test_a_sleeper_is_cut_by_the_wall_clock(workspace: Path) -> None:
    done = sandbox.run(workspace, ["sleep", "60"], limits=sandbox.Limits(wall_seconds=1))
    assert done.timed_out and done.seconds < 10


def test_a_big_file_is_cut_by_the_file_size_limit(workspace: Path) -> None:
    done = run(workspace, "head -c 4000000 /dev/zero > big")
    assert done.returncode != 0 and (workspace / "big").stat().st_size <= SMALL.file_bytes


def test_a_sandbox_that_cannot_start_is_an_error_not_a_command_failure(
    workspace: Path, tmp_path: Path
) -> None:
    missing = sandbox.Bind(tmp_path / "absent", "/absent")
    with pytest.raises(sandbox.SandboxError, match="did not start.*absent"):
        sandbox.run(workspace, ["true"], limits=SMALL, binds=(missing,))


def test_refused_user_namespaces_say_how_to_enable_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A kernel that refuses namespaces, as bwrap reports it: bwrap is run with an unshare it cannot do.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "bwrap").write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n"
    )
    (fake_bin / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    sandbox.probe_user_namespaces.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxError, match="unprivileged_userns_clone=1.*max_user_namespaces"):
            sandbox.probe_user_namespaces()
    finally:
        sandbox.probe_user_namespaces.cache_clear()


def test_sandbox_run_command_exits_with_the_command_status_and_hides_the_hidden_tests(tmp_path: Path) -> None:
    tasks = humaneval_task_file(tmp_path, count=1)
    done = subprocess.run(
        [OTEL_RL, "sandbox", "run", str(tasks), "--instance", "HumanEval__0", "--",
         "sh", "-c", "ls -A; test -e tests || echo no-hidden-tests; exit 7"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 7, done.stderr
    assert done.stdout.split() == [".git", "solution.py", "no-hidden-tests"]
    unknown = subprocess.run(
        [OTEL_RL, "sandbox", "run", str(tasks), "--instance", "nope", "--", "true"],
        capture_output=True,
        text=True,
    )
    assert unknown.returncode == 2 and "no task with instance_id 'nope'" in unknown.stderr
    assert "sandbox denied" not in done.stderr  # it tried to reach nothing


def test_sandbox_run_command_prints_the_connects_the_sandbox_denied(tmp_path: Path) -> None:
    tasks = humaneval_task_file(tmp_path, count=1)
    with socket.create_server(("127.0.0.1", 0)) as host_service:  # on the host's loopback, not forwarded
        port = host_service.getsockname()[1]
        host_service.settimeout(0)
        connect = f"import socket, sys; socket.socket().connect_ex(('127.0.0.1', {port})); sys.exit(5)"
        command = ["python", "-c", connect]
        done = subprocess.run(
            [OTEL_RL, "sandbox", "run", str(tasks), "--instance", "HumanEval__0", "--", *command],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        with pytest.raises(BlockingIOError):
            host_service.accept()  # the host's service never saw it
    assert done.returncode == 5, done.stderr
    assert done.stderr.splitlines() == [f"sandbox denied: tcp connect to 127.0.0.1:{port}"]


def test_forwarded_ports_are_reachable_inside_and_no_other_host_port(workspace: Path) -> None:
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"gateway saw " + body)

        def log_message(self, *args: object) -> None:
            pass

    gateway = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=gateway.serve_forever, daemon=True).start()
    other = socket.create_server(("127.0.0.1", 0))
    port, other_port = gateway.server_address[1], other.getsockname()[1]
    client = f"""
import socket, urllib.request
body = urllib.request.urlopen("http://127.0.0.1:{port}/v1", data=b"x" * 200000, timeout=10).read()
print(body[:12].decode(), len(body))
try:
    with socket.create_connection(("127.0.0.1", {other_port}), timeout=3) as other:
        other.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
        print("other reached", other.recv(100))
except OSError as error:
    print(type(error).__name__)
"""
    try:
        done = sandbox.run(workspace, ["python", "-c", client], limits=SMALL, forward=(port,))
        other.settimeout(0)
        with pytest.raises(BlockingIOError):  # nothing reached the host's own listener
            other.accept()
    finally:
        gateway.shutdown()
        other.close()
    # the host's other port is caught inside: the connect is reset before any byte, and recorded
    assert done.stdout.decode().split() == ["gateway", "saw", "200012", "ConnectionResetError"], done.stderr
    assert [(d.protocol, d.address, d.port) for d in done.denied] == [("tcp", "127.0.0.1", other_port)]


def test_outside_addresses_and_dns_are_denied_and_recorded_and_the_agent_cannot_undo_it(
    workspace: Path,
) -> None:
    gateway = socket.create_server(("127.0.0.1", 0))
    port = gateway.getsockname()[1]
    client = f"""
import errno, socket, subprocess
for host, port in [("93.184.215.14", 443), ("10.1.2.3", 80), ("::1", 22), ("127.0.0.1", 1)]:
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            s.sendall(b"x")
            print(host, port, "answered", s.recv(10))
    except OSError as error:
        print(host, port, type(error).__name__)
try:
    socket.getaddrinfo("pypi.org", 443)
    print("resolved")
except socket.gaierror:
    print("pypi.org unresolved")
for port in (8080, {port}, 53):  # a caught port, the forwarded one, DNS: all held outside the sandbox
    try:
        socket.create_server(("127.0.0.1", port))
        print(port, "bound")
    except OSError as error:
        print(port, errno.errorcode[error.errno])
routes = subprocess.run(["ip", "route", "del", "local", "0.0.0.0/0", "dev", "lo"], capture_output=True)
print("route", "deleted" if routes.returncode == 0 else "kept")
"""
    try:
        done = sandbox.run(workspace, ["python", "-c", client], limits=SMALL, forward=(port,))
    finally:
        gateway.close()
    lines = done.stdout.decode().splitlines()
    assert lines[:4] == [
        "93.184.215.14 443 ConnectionResetError",
        "10.1.2.3 80 ConnectionResetError",
        "::1 22 ConnectionResetError",
        "127.0.0.1 1 ConnectionRefusedError",  # no catch on a port nothing listens on: refused, unrecorded
    ], done.stderr
    assert lines[4:] == [
        "pypi.org unresolved", "8080 EADDRINUSE", f"{port} EADDRINUSE", "53 EACCES", "route kept",
    ], done.stderr  # fmt: skip
    tcp = [(d.address, d.port) for d in done.denied if d.protocol == "tcp"]
    assert tcp == [("93.184.215.14", 443), ("10.1.2.3", 80), ("::1", 22)]
    assert {d.name for d in done.denied if d.protocol == "dns"} == {"pypi.org"}
