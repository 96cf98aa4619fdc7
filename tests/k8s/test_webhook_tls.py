"""The webhook as ``gpuslice k8s webhook`` serves it (``webhook.run``): a client that opens a connection and
never finishes its TLS handshake is dropped after ``TLS_HANDSHAKE_TIMEOUT_S``, and others are served
meanwhile."""

from __future__ import annotations

import socket
import ssl
import threading
import time

import httpx
import trustme

from gpuslice.k8s import webhook

HANDSHAKE_S = 1.0  # the test's bound; the default is 10 s
DROPPED_WITHIN_S = 20.0  # generous on a loaded machine, and well under the 60 s asyncio would allow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_stalled_tls_handshake_is_dropped_and_others_are_served(tmp_path, monkeypatch):
    monkeypatch.setattr(webhook, "TLS_HANDSHAKE_TIMEOUT_S", HANDSHAKE_S, raising=False)
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    issued.cert_chain_pems[0].write_to_path(cert)
    issued.private_key_pem.write_to_path(key)
    port = _free_port()
    threading.Thread(
        target=webhook.run,
        args=(str(cert), str(key)),
        kwargs={"host": "127.0.0.1", "port": port},
        daemon=True,
    ).start()  # the server thread ends with the test process
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "the webhook did not start"
            time.sleep(0.05)

    stalled = socket.create_connection(("127.0.0.1", port), timeout=DROPPED_WITHIN_S)
    try:
        started = time.monotonic()
        context = ssl.create_default_context()
        ca.configure_trust(context)
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=context) as http:
            for _ in range(3):  # served while the stalled connection is open
                assert http.get("/healthz").json() == {"ok": True}
        try:
            data = stalled.recv(1)  # sends nothing; the server's close shows as end of stream
        except ConnectionResetError:
            data = b""
        except TimeoutError:
            raise AssertionError(
                f"a silent client still held its connection after {DROPPED_WITHIN_S} s"
            ) from None
        assert data == b""
        assert time.monotonic() - started >= HANDSHAKE_S * 0.5  # dropped by the timeout, not at once
    finally:
        stalled.close()
