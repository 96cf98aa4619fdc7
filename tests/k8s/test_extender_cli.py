"""``gpuslice k8s …`` wiring: each command parses its options and calls one function a layer down."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from gpuslice.cli import k8s as k8s_cli
from gpuslice.cli import k8s_device_plugin, main

runner = CliRunner()


def test_device_plugin_command_is_the_device_plugin_modules_own_function():
    command = next(c for c in k8s_cli.app.registered_commands if c.name == "device-plugin")
    assert command.callback is k8s_device_plugin.device_plugin
    result = runner.invoke(main.app, ["k8s", "device-plugin", "--help"])
    assert result.exit_code == 0, result.output
    for option in ("--simulate", "--split-count", "--socket-dir", "--node-name", "--kubeconfig", "--sharing"):
        assert option in result.output


def test_webhook_command_serves_with_the_given_certificate(monkeypatch, tmp_path):
    import trustme

    from gpuslice.k8s import webhook

    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    issued = trustme.CA().issue_cert("gpuslice-webhook.gpuslice.svc")
    issued.cert_chain_pems[0].write_to_path(str(cert))  # the command loads the pair before serving
    issued.private_key_pem.write_to_path(str(key))
    seen: dict[str, Any] = {}
    monkeypatch.setattr(webhook, "run", lambda *a, **kw: seen.update(args=a, **kw))
    result = runner.invoke(
        main.app, ["k8s", "webhook", "--cert", str(cert), "--key", str(key), "--port", "9443"]
    )
    assert result.exit_code == 0, result.output
    assert seen["args"] == (str(cert), str(key))
    assert seen["port"] == 9443


def test_extender_command_builds_the_state_with_the_policy_and_serves_it(monkeypatch, tmp_path):
    import uvicorn

    from gpuslice.k8s import extender

    made: dict[str, Any] = {}

    class Api:
        def __init__(self, kubeconfig: str | None) -> None:
            made["kubeconfig"] = kubeconfig

        def events(self):
            return iter(())

    served: dict[str, Any] = {}
    real_state = extender.ClusterState

    def state(api, default_policy, **options):
        made["policy"] = default_policy
        made.update(options)
        return real_state(api, default_policy=default_policy, **options)

    monkeypatch.setattr(extender, "KubernetesApi", Api)
    monkeypatch.setattr(extender, "ClusterState", state)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))
    kc = tmp_path / "kc"
    kc.write_text("apiVersion: v1\nkind: Config\n")
    result = runner.invoke(
        main.app, ["k8s", "extender", "--port", "9999", "--policy", "fgd", "--kubeconfig", str(kc)]
    )
    assert result.exit_code == 0, result.output
    assert served["port"] == 9999
    assert served["host"] == "127.0.0.1"  # its bind verb binds pods: loopback unless told otherwise
    # the C HTTP parser and event loop the k8s extra installs (the 5,000-node latency depends on them)
    assert (served["http"], served["loop"], served["access_log"]) == ("httptools", "uvloop", False)
    # the node lock is always on, with HAMi's 5-minute expiry unless told otherwise
    assert made == {
        "kubeconfig": str(kc),
        "policy": "fgd",
        "narrow": True,
        "target": None,
        "lock_timeout_s": 300.0,
    }
    assert [r.path for r in served["app"].routes if r.path in ("/filter", "/prioritize", "/bind")] == [
        "/filter",
        "/prioritize",
        "/bind",
    ]


def test_extender_metrics_port_serves_the_apps_series_on_every_address_and_stops_with_it(monkeypatch):
    """/bind stays on loopback; Prometheus scrapes the pod's IP on --metrics-port, which serves the same
    registry as the app's /metrics (the verbs' and the cluster's series), and closes when it stops."""
    import socket

    import httpx
    import uvicorn

    from gpuslice.k8s import extender

    class Api:
        def __init__(self, kubeconfig: str | None) -> None:
            pass

        def events(self):
            return iter(())

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    scraped: dict[str, str] = {}

    def run(app, **kw):
        scraped["host"] = kw["host"]
        scraped["text"] = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text

    monkeypatch.setattr(extender, "KubernetesApi", Api)
    monkeypatch.setattr(uvicorn, "run", run)
    result = runner.invoke(main.app, ["k8s", "extender", "--metrics-port", str(port)])
    assert result.exit_code == 0, result.output
    assert scraped["host"] == "127.0.0.1"
    assert "# TYPE gpuslice_extender_request_duration_seconds histogram" in scraped["text"]
    assert "gpuslice_cluster_preemptions_total" in scraped["text"]
    with pytest.raises(httpx.TransportError):  # the extender stopped: so did its metrics port
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_probe_exits_0_for_a_server_that_answers_and_1_for_none():
    """The exec readiness probe of the loopback-only extender."""
    import http.server
    import socket
    import threading

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 503)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert runner.invoke(main.app, ["k8s", "probe", f"http://127.0.0.1:{port}/healthz"]).exit_code == 0
        assert runner.invoke(main.app, ["k8s", "probe", f"http://127.0.0.1:{port}/other"]).exit_code == 1
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    url = f"http://127.0.0.1:{closed}/healthz"
    refused = runner.invoke(main.app, ["k8s", "probe", url, "--timeout", "1"])
    assert refused.exit_code == 1
    assert refused.output.startswith("error:")


def test_extender_without_a_kubernetes_configuration_is_one_error_line(tmp_path, monkeypatch, run_cli):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config; not in a pod
    monkeypatch.delenv("KUBECONFIG", raising=False)
    missing = tmp_path / "missing"
    for args, words in (
        ([], "error: no usable Kubernetes configuration"),
        (["--kubeconfig", str(missing)], f"error: cannot read --kubeconfig {missing}: No such file"),
    ):
        code, out, err = run_cli(["k8s", "extender", *args])
        assert code == 2, out + err
        assert (out + err).startswith(words) and "Traceback" not in err


def test_a_target_workload_that_is_not_a_pod_list_is_refused_before_anything_starts(tmp_path, run_cli):
    bad = tmp_path / "pods.csv"
    bad.write_text("a,b\n1,2\n")
    code, out, err = run_cli(["k8s", "extender", "--target-workload", str(bad)])
    assert code == 2 and (out + err).startswith("error:") and "header lacks" in out + err
    no_gpu = tmp_path / "cpu.csv"
    no_gpu.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,0,0\n")
    code, out, err = run_cli(["k8s", "extender", "--target-workload", str(no_gpu)])
    assert code == 2 and "no pod in it asks for a GPU" in out + err


@pytest.mark.parametrize("value", ["nan", "0", "-5", "1e9", "soon"])
def test_extender_refuses_a_node_lock_timeout_that_is_not_1_to_86400_seconds(value):
    result = runner.invoke(main.app, ["k8s", "extender", "--node-lock-timeout", value])
    assert result.exit_code == 2, result.output
    assert "--node-lock-timeout" in result.output
