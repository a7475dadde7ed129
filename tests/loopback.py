"""An ASGI app served by uvicorn in a thread of the test process, on a socket already bound to 127.0.0.1."""

import socket
import threading
import time

import uvicorn


class ThreadedServer:
    """uvicorn running `config`'s app on `sock` in a daemon thread; `start()` returns once it listens."""

    def __init__(self, config: uvicorn.Config, sock: socket.socket, *, what: str) -> None:
        self.server = uvicorn.Server(config)
        self.what = what  # for the error when it does not start
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)

    def start(self, timeout_s: float = 10) -> "ThreadedServer":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"{self.what} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 5) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=timeout_s)
