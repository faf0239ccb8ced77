"""A TCP proxy on 127.0.0.1 that counts the bytes a server sends back to its clients.

Usage (a child process of a benchmark)::

    python bench/_counting_proxy.py TARGET_PORT

Prints ``PROXY_PORT CONTROL_PORT`` on one line, then forwards every connection to its
port to ``127.0.0.1:TARGET_PORT``. A connection to the control port gets the total
number of bytes sent from the server to clients so far, as ASCII digits, and is closed.
Put in front of an S3 server, that total is what the clients read from storage: object
bytes plus the responses' headers (a few hundred bytes per request).
"""

from __future__ import annotations

import socket
import socketserver
import sys
import threading

_lock = threading.Lock()
_from_server = 0


def _pump(source: socket.socket, sink: socket.socket, count: bool) -> None:
    global _from_server
    try:
        while True:
            data = source.recv(1 << 20)
            if not data:
                break
            sink.sendall(data)
            if count:
                with _lock:
                    _from_server += len(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Forward(socketserver.BaseRequestHandler):
    target_port = 0

    def handle(self) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        back = threading.Thread(target=_pump, args=(upstream, self.request, True),
                                daemon=True)
        back.start()
        _pump(self.request, upstream, False)
        back.join()
        upstream.close()


class _Control(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with _lock:
            total = _from_server
        self.request.sendall(str(total).encode("ascii"))


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def read_count(control_port: int) -> int:
    """The proxy's count so far (for the benchmark, the parent side)."""
    with socket.create_connection(("127.0.0.1", control_port), timeout=30) as connection:
        chunks = []
        while chunk := connection.recv(64):
            chunks.append(chunk)
    return int(b"".join(chunks))


def main() -> int:
    _Forward.target_port = int(sys.argv[1])
    forward = _Server(("127.0.0.1", 0), _Forward)
    control = _Server(("127.0.0.1", 0), _Control)
    threading.Thread(target=control.serve_forever, daemon=True).start()
    print(forward.server_address[1], control.server_address[1], flush=True)
    forward.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
