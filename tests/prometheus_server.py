"""A real Prometheus (Debian's ``prometheus``) for the tests: started on a free loopback port with a
1-second scrape of the given targets, queried through its HTTP API, stopped with its folder's log."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A running Prometheus: ``query`` and ``wait_for`` over /api/v1/query; ``stop`` ends it."""

    def __init__(self, binary: str, folder: Path, targets: dict[str, list[str]]) -> None:
        """Scrape every ``targets`` job (name -> ["host:port", ...]) each second, data in ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        jobs = "".join(
            f"  - job_name: {name}\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: {list(hosts)!r}\n"
            for name, hosts in targets.items()
        )
        config = folder / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n" + jobs
        )
        self.log_path = folder / "prometheus.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed by stop)
        self._proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
            stdout=self._log, stderr=self._log, start_new_session=True,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        self.http = httpx.Client(base_url=self.url, timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.stop()
                raise AssertionError(f"prometheus exited: {self.log_path.read_text()[-2000:]}")
            try:
                if self.http.get("/-/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError("prometheus did not become ready in 30 s")

    def query(self, promql: str) -> list[dict[str, Any]]:
        r = self.http.get("/api/v1/query", params={"query": promql})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_for(self, promql: str, timeout: float, ok=lambda result: bool(result)) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(promql)
            if ok(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"{promql!r} still gave {result} after {timeout} s")
            time.sleep(0.5)

    def stop(self) -> None:
        self.http.close()
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()
