"""LLM memory estimator: how big a slice a model needs (sources: docs/references.md,
"LLM memory estimator"). Sits beside the scheduler; imports only units, errors and hardware.

``model_shapes`` architectures and the bundle · ``hf_config`` config.json → shape · ``inference`` and
``training`` per-GPU components · ``peers`` accelerate's and DeepSpeed's estimators, for the reference
numbers · ``fit`` the slice that holds it · ``request`` user input → estimate → memory request.
"""

from __future__ import annotations

from gpuslice.estimate.errors import InvalidEstimateOptions, MalformedModelConfig, UnknownModel
from gpuslice.estimate.fit import SliceFit, fit_slice, mem_value
from gpuslice.estimate.hf_config import load_hf_config, parse_hf_config
from gpuslice.estimate.inference import WEIGHT_DTYPES, estimate_inference
from gpuslice.estimate.model_shapes import BUNDLED, ModelShape, bundled_model
from gpuslice.estimate.request import (
    DEFAULT_MARGIN,
    EstimateOptions,
    estimate_request_bytes,
    resolve_model,
    run_estimate,
)
from gpuslice.estimate.result import Component, Estimate
from gpuslice.estimate.training import RECOMPUTE, estimate_training, model_states

__all__ = [
    "BUNDLED",
    "DEFAULT_MARGIN",
    "RECOMPUTE",
    "WEIGHT_DTYPES",
    "Component",
    "Estimate",
    "EstimateOptions",
    "InvalidEstimateOptions",
    "MalformedModelConfig",
    "ModelShape",
    "SliceFit",
    "UnknownModel",
    "bundled_model",
    "estimate_inference",
    "estimate_request_bytes",
    "estimate_training",
    "fit_slice",
    "load_hf_config",
    "mem_value",
    "model_states",
    "parse_hf_config",
    "resolve_model",
    "run_estimate",
]
