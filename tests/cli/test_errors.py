"""Bad input anywhere on the command line ends in one ``error:`` line and exit status 2, never a
traceback or a four-line box, and the message names the flag the user typed."""

from __future__ import annotations

import pytest

from gpuslice.cli.main import main, package_version


def _run(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


CASES = {
    "memsim trace file missing": (["memsim", "--trace", "/nonexistent.csv"], "--trace"),
    "memsim unknown visibility": (["memsim", "--visibility", "nope"], "--visibility"),
    "memsim unknown tenant priority": (["memsim", "--tenants", "0=ultra"], "--tenants"),
    "memsim negative tenant": (["memsim", "--tenants", "-1=high"], "--tenants"),
    "estimate infinite params": (["estimate", "--params", "inf"], "--params"),
    "estimate nan params": (["estimate", "--params", "nan"], "--params"),
    "estimate nothing to estimate": (["estimate"], "give a MODEL"),
    "openb zero jobs": (["sim", "openb", "--jobs", "0"], "--jobs"),
    "openb tune below one": (["sim", "openb", "--tune", "0.5"], "--tune"),
    "openb missing trace dir": (["sim", "openb", "--trace-dir", "/nonexistent"], "--trace-dir"),
    "submit zero gpus": (["submit", "--gpus", "0", "--", "true"], "--gpus"),
    "submit negative memory": (["submit", "--mem", "-5GiB", "--", "true"], "--mem"),
    "submit cores over 100": (["submit", "--cores", "150", "--", "true"], "--cores"),
    "submit share on several gpus": (["submit", "--gpus", "2", "--cores", "50", "--", "true"], "--gpus"),
    "mig bare number is not bytes": (["mig", "plan", "--gpu", "a100-80gb", "--request", "99"], "unit"),
    "topo every gpu busy": (
        ["topo", "pick", "--simulate", "dgx1-v100", "--gpus", "1", "--busy", "0,1,2,3,4,5,6,7"],
        "every GPU",
    ),
}


@pytest.mark.parametrize("args, names", CASES.values(), ids=CASES.keys())
def test_bad_input_is_one_error_line_naming_the_flag(args, names, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("GPUSLICE_STATE_DIR", str(tmp_path))  # no token there: arguments come first
    monkeypatch.delenv("GPUSLICE_TOKEN", raising=False)
    code, _, err = _run(args, capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert names in lines[0]
    assert "token" not in lines[0] and "compute_percent" not in lines[0]
    assert "ask for 1–0" not in lines[0] and "not both" not in lines[0]


def test_webhook_with_a_file_that_is_not_pem_is_one_error_line(tmp_path, capsys):
    junk = tmp_path / "cert.pem"
    junk.write_text("not a certificate\n")
    code, _, err = _run(["k8s", "webhook", "--cert", str(junk), "--key", str(junk)], capsys)
    assert code == 2
    assert err.startswith("error: cannot use --cert") and len(err.strip().splitlines()) == 1


def test_version_prints_the_installed_version(capsys):
    code, out, _ = _run(["--version"], capsys)
    assert code == 0
    assert out.strip() == f"gpuslice {package_version()}" and package_version() != "unknown"


def test_mig_plan_exits_3_when_a_request_is_rejected(capsys):
    args = ["mig", "plan", "--gpu", "a100-80gb", "--request", "7g.80gb", "--request", "7g.80gb"]
    code, out, _ = _run(args, capsys)
    assert code == 3
    assert "rejected 7g.80gb" in out
    code, _, _ = _run(["mig", "plan", "--gpu", "a100-80gb", "--request", "7g.80gb"], capsys)
    assert code == 0
