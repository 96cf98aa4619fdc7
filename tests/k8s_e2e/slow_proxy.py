"""A reverse proxy in front of the e2e API server that makes chosen reads slow: the "one slow API read"
a node's DRA driver meets when the API server is loaded, aimed at one object.

It listens on plain HTTP on 127.0.0.1 (the client's bearer token passes through to the API server, which
it reaches over TLS with the cluster's CA) and relays every request. A GET whose path ends with one of
``slow_paths`` waits ``delay_s`` before it is sent on. Streamed answers (watches) are relayed chunk by
chunk as they arrive.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}


class SlowProxy:
    """``SlowProxy(upstream, ca_file, slow_paths, delay_s).start()``; ``url`` is its address."""

    def __init__(self, upstream: str, ca_file: Path, slow_paths: Iterable[str], delay_s: float) -> None:
        parts = urlsplit(upstream)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 443
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.context.check_hostname = False  # the self-signed serving certificate names no 127.0.0.1
        self.slow_paths = tuple(slow_paths)
        self.delay_s = delay_s
        self.delayed: list[tuple[str, float]] = []  # (path, when it was let through)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="slow-proxy")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> SlowProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # quiet
                return

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                path = self.path.split("?", 1)[0]
                if self.command == "GET" and path.endswith(proxy.slow_paths):
                    time.sleep(proxy.delay_s)
                    proxy.delayed.append((path, time.monotonic()))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                upstream = http.client.HTTPSConnection(
                    proxy.host, proxy.port, context=proxy.context, timeout=120
                )
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    self.send_response(answer.status, answer.reason)
                    for key, value in answer.getheaders():
                        if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                            self.send_header(key, value)
                    if answer.getheader("Content-Length") is not None:
                        data = answer.read()
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                        return
                    self.send_header("Transfer-Encoding", "chunked")  # a watch: pass each piece on
                    self.end_headers()
                    while chunk := answer.read1(65536):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                finally:
                    upstream.close()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _relay

        return Handler
