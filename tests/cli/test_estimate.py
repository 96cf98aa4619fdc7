"""gpuslice estimate: the table, the JSON keys, and user errors that exit 2 through the root app's rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gpuslice.cli.estimate import estimate
from gpuslice.errors import UserError, exit_code

CONFIGS = Path(__file__).parents[1] / "estimate" / "configs"
runner = CliRunner()
app = typer.Typer()
app.command()(estimate)  # registered alone, the command is the app itself: no sub-command name


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "140"})


def test_json_lists_every_component_in_bytes_and_the_per_gpu_total():
    result = invoke("llama-3-8b", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data["components"]) == {"weights", "kv_cache", "activations", "cuda_context"}
    assert data["total_bytes_per_gpu"] == sum(data["components"].values())
    assert all(isinstance(v, int) for v in data["components"].values())
    assert data["slice"]["mem"] == "18GiB" and "L4" in data["slice"]["gpu_models"]
    assert {"model", "mode", "gpus", "parameters", "settings"} <= set(data)


def test_training_json_has_model_states_activations_and_the_zero3_layer():
    result = invoke("llama-3-70b", "--train", "--gpus", "64", "--zero", "3", "--recompute", "full", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert {"weights", "gradients", "optimizer", "activations", "zero3_gathered_layer"} <= set(
        data["components"]
    )
    assert data["gpus"] == 64 and data["settings"]["zero"] == 3


def test_table_shows_components_total_mem_value_gpu_models_and_mig_profiles():
    result = invoke("mistral-7b", "--dtype", "int4", "--context", "8192")
    assert result.exit_code == 0, result.output
    expected = ("weights", "KV cache", "activation peak", "CUDA context", "total per GPU",
                "smallest slice: --mem", "GPU models that hold it:", "MIG profiles that hold")  # fmt: skip
    for text in expected:
        assert text in result.output


def test_the_table_names_gpu_models_as_their_vendor_does_and_json_by_catalogue_name():
    """A person reads "V100 16GB", not openb's code "V100M16"; scripts keep the catalogue names."""
    output = " ".join(invoke("mistral-7b", "--dtype", "int4").output.split())  # wrapped lines joined
    models = output.split("hold it:")[1].split("MIG profiles")[0]
    assert "V100 16GB" in models and "H200 141GB" in models and "openb G2 (20 GB)" in models
    assert "V100M16" not in models and "G2," not in models
    data = json.loads(invoke("mistral-7b", "--dtype", "int4", "--json").output)
    assert "V100M16" in data["slice"]["gpu_models"]


def test_a_config_path_and_a_bare_parameter_count_work():
    assert invoke(str(CONFIGS / "mixtral-8x7b.json"), "--tp", "2").exit_code == 0
    result = invoke("--params", "7.5e9", "--train", "--gpus", "64", "--zero", "2", "--json")
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.output)["components"]) == {
        "weights",
        "gradients",
        "optimizer",
        "cuda_context",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("gpt-9",), "is not a bundled model; known: llama-3-8b"),
        (("llama-3-70b", "--zero", "3"), "--zero: training options; add --train"),
        (("llama-3-70b", "--tp", "3"), "--tp 3 does not divide llama-3-70b's 64 attention heads"),
        (("llama-3-70b", "--train", "--context", "8192"), "--context: inference options"),
        (("llama-3-70b", "--params", "7e9"), "not both"),
        ((str(CONFIGS / "absent.json"),), "cannot read"),
    ],
)
def test_user_errors_exit_2_with_a_clear_message(args, message):
    result = invoke(*args)
    assert isinstance(result.exception, UserError), result.output
    assert exit_code(result.exception) == 2
    assert message in str(result.exception)


def test_a_malformed_config_names_the_field(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    result = invoke(str(path))
    assert isinstance(result.exception, UserError)
    assert "'num_hidden_layers' is missing" in str(result.exception)


def test_submit_with_estimate_refuses_an_explicit_mem_too():
    from typer.testing import CliRunner

    from gpuslice.cli.main import app

    result = CliRunner().invoke(app, ["submit", "--estimate", "llama-3-8b", "--mem", "3GiB", "--", "true"])
    assert result.exit_code != 0
    assert "--estimate sets --mem" in str(result.exception) + result.output


def test_submit_with_estimate_sends_the_estimated_memory_to_the_server(monkeypatch):
    from typer.testing import CliRunner

    from gpuslice.cli import jobs
    from gpuslice.cli.main import app
    from gpuslice.estimate import EstimateOptions, estimate_request_bytes

    sent = {}

    class FakeClient:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, body, idempotency_key=None, retries=0):
            assert idempotency_key  # the CLI makes every submit safe to retry
            sent.update(body)
            return {"id": "j-1", "state": "PENDING", "spec": {"gpu_memory_bytes": 1}, **body}

    monkeypatch.setattr(jobs, "_client", lambda url, state_dir: FakeClient())
    monkeypatch.setattr(jobs, "slice_text", lambda job: "slice")
    result = CliRunner().invoke(app, ["submit", "--estimate", "llama-3-8b", "--", "python", "serve.py"])
    assert result.exit_code == 0, result.output
    expected, _ = estimate_request_bytes("llama-3-8b", EstimateOptions())
    assert sent["memory"] == f"{expected}B"  # bytes with their unit: a bare number is refused
    assert sent["gpus"] == 1
    assert "memory from estimate" in result.output
