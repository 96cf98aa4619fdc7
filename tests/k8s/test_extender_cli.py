"""``gpuslice k8s …`` wiring: each command parses its options and calls one function a layer down."""

from __future__ import annotations

from typing import Any

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


def test_extender_command_builds_the_state_with_the_policy_and_serves_it(monkeypatch):
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

    def state(api, default_policy):
        made["policy"] = default_policy
        return real_state(api, default_policy=default_policy)

    monkeypatch.setattr(extender, "KubernetesApi", Api)
    monkeypatch.setattr(extender, "ClusterState", state)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))
    result = runner.invoke(
        main.app, ["k8s", "extender", "--port", "9999", "--policy", "fgd", "--kubeconfig", "kc"]
    )
    assert result.exit_code == 0, result.output
    assert served["port"] == 9999
    # the C HTTP parser and event loop the k8s extra installs (the 5,000-node latency depends on them)
    assert (served["http"], served["loop"], served["access_log"]) == ("httptools", "uvloop", False)
    assert made == {"kubeconfig": "kc", "policy": "fgd"}
    assert [r.path for r in served["app"].routes if r.path in ("/filter", "/prioritize", "/bind")] == [
        "/filter",
        "/prioritize",
        "/bind",
    ]
