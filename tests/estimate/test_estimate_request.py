"""From user input to an estimate and to a memory request with its safety margin."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.estimate.errors import InvalidEstimateOptions, UnknownModel
from gpuslice.estimate.request import EstimateOptions, estimate_request_bytes, resolve_model, run_estimate
from gpuslice.units import MiB

CONFIGS = Path(__file__).parent / "configs"


def test_request_is_the_estimate_plus_the_margin_rounded_up_to_a_mib():
    est = run_estimate("llama-3-8b", EstimateOptions())
    request, text = estimate_request_bytes("llama-3-8b", margin=0.1)
    assert request % MiB == 0
    assert est.total_bytes_per_gpu * 1.1 <= request < est.total_bytes_per_gpu * 1.1 + MiB
    assert text.startswith("llama-3-8b inference (") and "+ 10% safety margin" in text and "× 1 GPU" in text


def test_a_zero_margin_requests_the_estimate_itself():
    est = run_estimate("llama-3-70b", EstimateOptions(train=True, gpus=64, zero=3))
    options = EstimateOptions(train=True, gpus=64, zero=3)
    request, text = estimate_request_bytes("llama-3-70b", options, margin=0)
    assert request == -(-est.total_bytes_per_gpu // MiB) * MiB
    assert "× 64 GPUs" in text


def test_a_bare_parameter_count_and_a_config_path_are_accepted():
    assert estimate_request_bytes(None, params=7.5e9)[0] > 15e9
    by_path = estimate_request_bytes(str(CONFIGS / "llama-3-8b.json"))[0]
    assert by_path == estimate_request_bytes("llama-3-8b")[0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (EstimateOptions(zero=3), "--zero: training options; add --train"),
        (EstimateOptions(gpus=8, seq_len=2048), "--gpus, --seq-len: training options"),
        (EstimateOptions(train=True, context=4096), "--context: inference options; drop them with --train"),
        (EstimateOptions(train=True, flash_attention=True), "--flash-attention: inference options"),
    ],
)
def test_options_of_the_other_mode_are_contradictions(options, message):
    with pytest.raises(InvalidEstimateOptions, match=message):
        run_estimate("llama-3-8b", options)


def test_model_and_params_are_exclusive_and_one_is_needed():
    with pytest.raises(InvalidEstimateOptions, match="not both"):
        resolve_model("llama-3-8b", 7e9)
    with pytest.raises(InvalidEstimateOptions, match=r"give a MODEL .* or --params, e\.g\."):
        resolve_model(None, None)


def test_unknown_names_and_bad_margins_are_user_errors():
    with pytest.raises(UnknownModel, match="known: llama-3-8b"):
        estimate_request_bytes("gpt-5")
    with pytest.raises(InvalidEstimateOptions, match=r"margin 1\.5"):
        estimate_request_bytes("llama-3-8b", margin=1.5)
