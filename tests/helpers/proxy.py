"""A loopback TCP proxy that can fake an outage: it refuses connections (and cuts the open ones) for a while.

`FlakyProxy(upstream_port)` listens on 127.0.0.1 and pipes every connection to the upstream port.
`outage(seconds)` starts an outage now: open connections are reset, and every new connection is
accepted and reset at once, which a client sees as a refused/reset connection. The outage ends
`seconds` after the first connection it turns away, so a slow client (cold imports on a loaded
machine) still meets it, however long it takes to connect. `refused` counts the connections turned
away, so a test can show that its reads really met the outage.
"""
from __future__ import annotations

import selectors
import socket
import struct
import threading
import time


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a dead or restarting server would look to the client."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class FlakyProxy:
    """127.0.0.1:port -> 127.0.0.1:upstream_port, with outages on demand; a context manager."""

    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", int(upstream_port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self.refused = 0
        self.outages = 0
        self._down_until = 0.0
        self._outage_seconds = 0.0      # how long an outage lasts once its first connection is refused
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="flaky-proxy", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def down(self) -> bool:
        return time.monotonic() < self._down_until

    def outage(self, seconds: float) -> None:
        """Reset the connections open now, and refuse new ones until `seconds` after the first refusal."""
        with self._lock:
            self._down_until = float("inf")
            self._outage_seconds = float(seconds)
            self.outages += 1
            victims, self._open = self._open, set()
        for s in victims:
            _reset(s)

    def wait_until_up(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.down:
            if time.monotonic() > deadline:
                raise TimeoutError("the proxy's outage did not end")
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()
        with self._lock:
            victims, self._open = self._open, set()
        for s in victims:
            s.close()

    def __enter__(self) -> FlakyProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.down:
                with self._lock:
                    self.refused += 1
                    if self._down_until == float("inf"):    # the first refusal starts the outage's clock
                        self._down_until = time.monotonic() + self._outage_seconds
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._open.update((client, upstream))
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        peers = {a: b, b: a}
        try:
            for s in peers:
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.2):
                    src = key.fileobj
                    data = src.recv(1 << 16)
                    if not data:
                        return
                    peers[src].setblocking(True)
                    peers[src].sendall(data)
                    peers[src].setblocking(False)
        except (OSError, ValueError):
            return  # reset by an outage, or closed by either side
        finally:
            sel.close()
            with self._lock:
                self._open.discard(a)
                self._open.discard(b)
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass
