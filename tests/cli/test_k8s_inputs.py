"""The Kubernetes commands refuse an option they can check alone before they reach the API server:
found by the command-line fuzzer (``test_fuzz_inputs.py``), an unknown extender --policy and a device
plugin --sharing that pods cannot have were refused only after the connection (so without a cluster
the error was about the kubeconfig, not the mistake)."""

from __future__ import annotations

from unittest import mock

import pytest

from gpuslice.cli.main import main


class Connected(BaseException):
    """The command reached for the API server: the input was accepted."""


def _connect(*_args: object, **_kwargs: object) -> None:
    raise Connected


def _refused(args: list[str], target: str, capsys: pytest.CaptureFixture[str]) -> str:
    with mock.patch(target, _connect), pytest.raises(SystemExit) as ended:
        main(args)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert ended.value.code == 2 and len(errors) == 1
    return errors[0]


@pytest.mark.parametrize("policy", ["no-such-policy", "missing.py"])
def test_the_extender_refuses_an_unknown_policy_before_the_api(policy, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    error = _refused(["k8s", "extender", "--policy", policy], "gpuslice.k8s.extender.KubernetesApi", capsys)
    assert policy in error


@pytest.mark.parametrize("sharing", ["bogus", "mps", "mig"])
def test_the_device_plugin_refuses_a_sharing_mode_pods_cannot_have_before_the_api(sharing, capsys) -> None:
    args = ["k8s", "device-plugin", "--simulate", "dgx-a100", "--node-name", "node-a", "--sharing", sharing]
    error = _refused(args, "gpuslice.k8s.device_plugin.serve", capsys)
    assert "--sharing" in error


@pytest.mark.parametrize("option", ["--socket-dir", "--state-dir"])
def test_the_device_plugin_refuses_a_folder_it_cannot_write_before_the_api(option, tmp_path, capsys) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("")
    args = ["k8s", "device-plugin", "--simulate", "dgx-a100", "--node-name", "node-a", option, str(taken)]
    assert option in _refused(args, "gpuslice.k8s.device_plugin.serve", capsys)


@pytest.mark.parametrize("option", ["--plugins-dir", "--registry-dir", "--cdi-dir", "--state-dir"])
def test_the_dra_driver_refuses_a_folder_it_cannot_write_before_the_api(option, tmp_path, capsys) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("")
    args = ["k8s", "dra-driver", "--simulate", "dgx-a100", "--node-name", "node-a", option, str(taken)]
    assert option in _refused(args, "gpuslice.k8s.dra.kube.DraApi", capsys)
