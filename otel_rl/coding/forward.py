"""A sandbox's network: its own namespace where exactly the forwarded host loopback ports (the gateway, the
OTLP endpoint) are reachable, and where attempts to reach anything else are denied and recorded here.

Before bwrap starts, a bootstrap (our code; the agent has not run yet) enters a new network namespace
(`unshare --net`, with a user namespace where the caller is not root), brings loopback up, routes every
address to it ("AnyIP": a connect to 1.2.3.4 or to the host's resolver lands on the namespace's loopback),
binds the listening sockets, hands them to this process over a unix socket (SCM_RIGHTS), then execs bwrap,
which shares that namespace and starts the command without the privilege to change it. This process, outside
the sandbox's PID namespace, serves those sockets: forwarded ports are relayed to the host's loopback, the
catch ports (well-known ones and every port the host listens on) and DNS are denied and recorded. The agent
cannot kill, rebind or write to them: it sees neither this process nor the sockets' owner.
Not observed: TCP connects to a port nothing on the host listens on (refused by the kernel), UDP other than
DNS, ICMP.
"""

import json
import os
import selectors
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

import psutil

BUFFER = 1 << 16
MAX_RECORDS = 100  # denied attempts kept with their destination (a span keeps 128 events); all are counted
MAX_CATCH_PORTS = 200  # the ports one SCM_RIGHTS message carries (the kernel allows 253 fds)
WELL_KNOWN = (
    21,
    22,
    25,
    53,
    80,
    443,
    873,
    3128,
    8080,
    8443,
    9418,
)  # ftp ssh smtp dns http(s) rsync proxy git
HANDSHAKE_S = 60.0
# `python -I -S -c BOOTSTRAP CONTROL IP SPEC -- BWRAP...`: runs in the new network namespace, as the caller.
BOOTSTRAP = """
import json, os, socket, subprocess, sys

control, ip, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
split = sys.argv.index("--")
routes = "link set lo up\\nroute add local 0.0.0.0/0 dev lo\\n"
subprocess.run([ip, "-batch", "-"], input=routes.encode(), check=True)
# IPv6 too, where the kernel has it
subprocess.run([ip, "route", "add", "local", "::/0", "dev", "lo"], stderr=subprocess.DEVNULL, check=False)

def listener(kind, port):
    kind_type = socket.SOCK_DGRAM if kind == "dns" else socket.SOCK_STREAM
    if kind == "forward":  # the host's port, on the same address
        sock = socket.socket(socket.AF_INET, kind_type)
        sock.bind(("127.0.0.1", port))
    else:  # every address of the namespace: IPv4 and IPv6 where the kernel has IPv6
        try:
            sock = socket.socket(socket.AF_INET6, kind_type)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", port))
        except OSError:
            sock = socket.socket(socket.AF_INET, kind_type)
            sock.bind(("", port))
    if kind_type == socket.SOCK_STREAM:
        sock.listen(128)
    return sock

socks = [listener(kind, port) for kind, port in spec]
with socket.socket(socket.AF_UNIX) as channel:
    channel.connect(control)
    socket.send_fds(channel, [b"sockets"], [s.fileno() for s in socks])
    if channel.recv(2) != b"ok":
        sys.exit("the host did not take the sandbox's sockets")
for sock in socks:
    sock.close()
os.execvp(sys.argv[split + 1], sys.argv[split + 1:])
"""


@dataclass(frozen=True)
class Denied:
    """One denied attempt: `protocol` "tcp" (a connect) or "dns" (a query), where to, when."""

    time_unix_nano: int
    protocol: str
    address: str
    port: int
    name: str = ""  # the queried name (dns)


@dataclass
class Network:
    """While open: `prefix` starts a command (bwrap) in the namespace; `denied` fills as attempts arrive."""

    prefix: list[str]
    denied: list[Denied] = field(default_factory=list)
    count: int = 0  # every denied attempt, recorded or not
    ready: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _caught: list[socket.socket] = field(default_factory=list)

    def record(self, denied: Denied) -> None:
        self.count += 1
        if len(self.denied) < MAX_RECORDS:
            self.denied.append(denied)

    def settle(self) -> None:
        """Take every attempt still queued on the catch sockets (call once the sandbox has exited)."""
        with self._lock:
            for sock in self._caught:
                while _deny(sock, self):
                    pass


def catch_ports(forwarded: list[int]) -> list[tuple[str, int]]:
    """The sockets to bind besides the forwarded ports: DNS, the well-known ports, and every TCP port the
    host listens on (what the agent could reach with no network namespace), up to MAX_CATCH_PORTS."""
    listening = {
        c.laddr.port for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN and c.laddr
    }
    ports = [p for p in dict.fromkeys([*WELL_KNOWN, *sorted(listening)]) if p not in forwarded]
    return [("dns", 53), *(("tcp", port) for port in ports[: MAX_CATCH_PORTS - 1])]


def _dns_question(query: bytes) -> tuple[str, int]:
    """The first question's name of a DNS query (RFC 1035 labels, no compression) and where the question
    ends (after its type and class); ("", 0) when malformed."""
    labels, at = [], 12
    while at < len(query) and len(labels) < 128:
        size = query[at]
        if size == 0:
            end = at + 5
            return (".".join(labels), end) if end <= len(query) else ("", 0)
        if size > 63 or at + 1 + size > len(query):
            return "", 0
        labels.append(query[at + 1 : at + 1 + size].decode("ascii", errors="replace"))
        at += 1 + size
    return "", 0


def _refused(query: bytes, end: int) -> bytes:
    """The DNS answer REFUSED (rcode 5) to a query, its question echoed (resolvers match answers on it)."""
    ident, flags = struct.unpack("!HH", query[:4])
    header = struct.pack("!HHHHHH", ident, 0x8000 | (flags & 0x7900) | 5, 1 if end else 0, 0, 0, 0)
    return header + query[12:end]


def _deny(sock: socket.socket, network: Network) -> bool:
    """Take one queued attempt on a catch socket (non-blocking); False when none is queued."""
    try:
        if sock.type == socket.SOCK_DGRAM:
            query, peer = sock.recvfrom(512)
            if len(query) >= 12:
                name, end = _dns_question(query)
                network.record(Denied(time.time_ns(), "dns", "", 53, name[:255]))
                sock.sendto(_refused(query, end), peer)
            return True
        conn, _ = sock.accept()
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return False
    with conn:
        host, port = conn.getsockname()[:2]  # the address it asked for: every address is local here
        network.record(Denied(time.time_ns(), "tcp", host.removeprefix("::ffff:"), port))
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset, not a close
    return True


def _relay(conn: socket.socket, port: int) -> None:
    """One connection from inside, relayed to the host's loopback port."""
    try:
        upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        conn.close()
        return
    upstream.settimeout(None)
    conn.setblocking(True)
    with conn, upstream, selectors.DefaultSelector() as selector:
        selector.register(conn, selectors.EVENT_READ, upstream)
        selector.register(upstream, selectors.EVENT_READ, conn)
        while True:
            for key, _ in selector.select():
                try:
                    data = key.fileobj.recv(BUFFER)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
                except OSError:
                    return


def _take_sockets(control: socket.socket, spec: list[tuple[str, int]]) -> list[socket.socket] | None:
    """The bootstrap's sockets, in the order of `spec`, or None when it never came or sent something else."""
    control.settimeout(HANDSHAKE_S)
    try:
        conn, _ = control.accept()
    except OSError:
        return None
    with conn:
        conn.settimeout(10)
        try:
            message, fds, _, _ = socket.recv_fds(conn, 64, len(spec) + 1)
        except OSError:
            return None
        socks = [socket.socket(fileno=fd) for fd in fds]
        if message != b"sockets" or len(socks) != len(spec):
            for sock in socks:
                sock.close()
            return None
        conn.sendall(b"ok")
    return socks


def _serve(
    network: Network, control: socket.socket, spec: list[tuple[str, int]], stop: socket.socket
) -> None:
    socks = _take_sockets(control, spec)
    control.close()
    network.ready.set()
    if socks is None:
        return
    with selectors.DefaultSelector() as selector:
        selector.register(stop, selectors.EVENT_READ, None)
        for (kind, port), sock in zip(spec, socks, strict=True):
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ, (kind, port))
            if kind != "forward":
                network._caught.append(sock)
        try:
            while True:
                for key, _ in selector.select():
                    if key.data is None:
                        return
                    kind, port = key.data
                    sock = key.fileobj
                    if kind == "forward":
                        with suppress(BlockingIOError, InterruptedError):
                            conn, _ = sock.accept()  # type: ignore[union-attr]
                            threading.Thread(target=_relay, args=(conn, port), daemon=True).start()
                    else:
                        with network._lock:
                            _deny(sock, network)  # type: ignore[arg-type]
        finally:
            for sock in socks:
                sock.close()


def unshare_prefix() -> list[str]:
    """`unshare` making the network namespace: a user namespace with it where the caller is not root."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise OSError("unshare (Debian package util-linux) is not installed")
    return [unshare, "--net", *(["--user", "--map-root-user"] if os.geteuid() != 0 else []), "--"]


@contextmanager
def network(ports: list[int], *, python: str) -> Iterator[Network]:
    """A namespace for one sandbox where `ports` of the host's loopback are reachable; `python` runs the
    bootstrap (any interpreter: it imports the standard library only, -I -S)."""
    for port in ports:
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is not a TCP port")
    ip = shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip") if os.path.exists(p)), None)
    if ip is None:
        raise OSError("ip (Debian package iproute2) is not installed")
    spec = [*(("forward", port) for port in dict.fromkeys(ports)), *catch_ports(ports)]
    with tempfile.TemporaryDirectory(prefix="otel-rl-net-") as folder:
        os.chmod(folder, 0o700)  # the bootstrap runs as the caller, before anything of the sandbox
        control = socket.socket(socket.AF_UNIX)
        control.bind(f"{folder}/control.sock")
        control.listen(1)
        stop_reader, stop_writer = socket.socketpair()
        prefix = [*unshare_prefix(), python, "-I", "-S", "-c", BOOTSTRAP, f"{folder}/control.sock", ip,
                  json.dumps(spec), "--"]  # fmt: skip
        net = Network(prefix)
        server = threading.Thread(target=_serve, args=(net, control, spec, stop_reader), daemon=True)
        server.start()
        try:
            yield net
        finally:
            with suppress(OSError):  # wakes a handshake still waiting (the sandbox never started)
                control.shutdown(socket.SHUT_RDWR)
            stop_writer.send(b"x")
            server.join()
            stop_reader.close()
            stop_writer.close()
