"""Host loopback ports made reachable inside a sandbox's network namespace (the gateway, the OTLP endpoint),
and nothing else: each port goes through a unix socket bound into the sandbox, served by a thread here and
listened for inside on the same loopback port by a small forwarder that then runs the sandboxed command."""

import os
import selectors
import socket
import socketserver
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

INSIDE = "/run/otel-rl-forward"
BUFFER = 1 << 16
# Runs inside the sandbox (`python -I forward.py PORT... -- CMD...`): binds every port first, so that the
# command can connect at once, then forks: the child forwards, the parent becomes the command.
INSIDE_FORWARDER = """
import os, socket, sys

async def pump(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()

async def serve(listener, port):
    async def connection(reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(f"{folder}/{port}.sock")
        except OSError:
            writer.close()
            return
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
    server = await asyncio.start_server(connection, sock=listener)
    await server.serve_forever()

async def main(listeners):
    await asyncio.gather(*(serve(sock, port) for port, sock in listeners))

folder = os.path.dirname(os.path.abspath(__file__))
split = sys.argv.index("--")
listeners = []
for port in sys.argv[1:split]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", int(port)))
    sock.listen(128)
    listeners.append((int(port), sock))
if os.fork() == 0:
    import asyncio  # the forwarder's only: the command starts without paying for it

    os.setsid()
    asyncio.run(main(listeners))
    os._exit(0)
for _, sock in listeners:
    sock.close()
os.execvp(sys.argv[split + 1], sys.argv[split + 1:])
"""


class _Relay(socketserver.BaseRequestHandler):
    """One connection from inside the sandbox, relayed to the host's loopback port."""

    server: "_UnixRelay"

    def handle(self) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.server.port), timeout=10)
        except OSError:
            return
        upstream.settimeout(None)
        with upstream, selectors.DefaultSelector() as selector:
            selector.register(self.request, selectors.EVENT_READ, upstream)
            selector.register(upstream, selectors.EVENT_READ, self.request)
            while True:
                for key, _ in selector.select():
                    data = key.fileobj.recv(BUFFER)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)


class _UnixRelay(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, port: int) -> None:
        self.port = port
        super().__init__(path, _Relay)


@contextmanager
def forwarded(ports: list[int], *, owner: tuple[int, int] | None) -> Iterator[tuple[Path, list[str]]]:
    """While open: a folder to bind at INSIDE, and the command prefix that starts the inside forwarder."""
    for port in ports:
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is not a TCP port")
    with tempfile.TemporaryDirectory(prefix="otel-rl-forward-") as folder:
        os.chmod(folder, 0o755)
        (Path(folder) / "forward.py").write_text(INSIDE_FORWARDER)
        relays = [_UnixRelay(f"{folder}/{port}.sock", port) for port in ports]
        for port, relay in zip(ports, relays, strict=True):
            if owner is not None:
                os.chown(f"{folder}/{port}.sock", *owner)
            threading.Thread(target=relay.serve_forever, daemon=True, name=f"forward-{port}").start()
        try:
            prefix = [sys.executable, "-I", "-S", f"{INSIDE}/forward.py", *map(str, ports), "--"]
            yield Path(folder), prefix
        finally:
            for relay in relays:
                stopper = threading.Thread(target=relay.shutdown)
                stopper.start()
                relay.socket.shutdown(socket.SHUT_RDWR)  # wakes its select now, not at the next 0.5 s poll
                stopper.join()
                relay.server_close()
