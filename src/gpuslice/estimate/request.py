"""From what a user types to an estimate, and from an estimate to a memory request.

``run_estimate`` is what ``gpuslice estimate`` calls; ``estimate_request_bytes`` is what ``gpuslice
submit --estimate`` calls: the estimate's per-GPU total plus a stated safety margin (default 10 %,
which covers what the formulas leave out: allocator fragmentation, logits, temporary buffers —
accelerate's model-size estimator docs cite up to ~20 % over the weights for inference).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from gpuslice.estimate.errors import InvalidEstimateOptions
from gpuslice.estimate.hf_config import load_hf_config
from gpuslice.estimate.inference import estimate_inference
from gpuslice.estimate.model_shapes import ModelShape, bundled_model
from gpuslice.estimate.result import Estimate
from gpuslice.estimate.training import estimate_training
from gpuslice.inputs import file_kind
from gpuslice.units import MiB, format_size

__all__ = ["DEFAULT_MARGIN", "EstimateOptions", "estimate_request_bytes", "resolve_model", "run_estimate"]

DEFAULT_MARGIN = 0.1
_MAX_PARAMS = 1e15

_TRAIN_ONLY = ("gpus", "zero", "recompute", "micro_batch", "seq_len")
_INFER_ONLY = ("context", "batch", "kv_dtype", "flash_attention")


@dataclass(frozen=True, slots=True)
class EstimateOptions:
    """The CLI's options as given; ``None`` / ``False`` means "not given" so contradictions can be seen."""

    train: bool = False
    dtype: str = "bf16"
    tp: int = 1
    context: int | None = None
    batch: int | None = None
    kv_dtype: str | None = None
    flash_attention: bool = False
    gpus: int | None = None
    zero: int | None = None
    recompute: str | None = None
    micro_batch: int | None = None
    seq_len: int | None = None

    def check(self) -> None:
        """Options of the other mode are contradictions, named with their flags."""
        wrong = _INFER_ONLY if self.train else _TRAIN_ONLY
        given = [name for name in wrong if getattr(self, name) not in (None, False)]
        if given:
            flags = ", ".join("--" + n.replace("_", "-") for n in given)
            if self.train:
                raise InvalidEstimateOptions(f"{flags}: inference options; drop them with --train "
                                             "(training uses --seq-len and --micro-batch)")  # fmt: skip
            raise InvalidEstimateOptions(f"{flags}: training options; add --train to use them")


def resolve_model(model: str | None, params: float | None = None) -> ModelShape | int:
    """A bundled name, a path to a config.json (or its folder), or ``params`` as a bare count."""
    if model is None and params is None:
        raise InvalidEstimateOptions(
            "give a MODEL (a bundled name or a config.json path) or --params, e.g. --params 7.5e9"
        )
    if model is not None and params is not None:
        raise InvalidEstimateOptions("give a MODEL or --params, not both")
    if params is not None:
        # A count beyond 1e15 (a thousand times the largest models) is a typo; inf and nan are refused too.
        if not 1 <= params <= _MAX_PARAMS:
            raise InvalidEstimateOptions(
                f"--params {params:g}: a parameter count must be from 1 to {_MAX_PARAMS:.0e}, e.g. 7.5e9"
            )
        return round(params)
    assert model is not None
    path = Path(model).expanduser()
    if file_kind(path) != "missing" or model.endswith(".json"):
        return load_hf_config(path)
    return bundled_model(model)


def run_estimate(model: str | None, options: EstimateOptions, params: float | None = None) -> Estimate:
    """The estimate the options ask for; InvalidEstimateOptions before anything is computed."""
    options.check()
    shape = resolve_model(model, params)
    if options.train:
        return estimate_training(
            shape, dtype=options.dtype, gpus=options.gpus or options.tp, tp=options.tp,
            zero=options.zero or 0, recompute=options.recompute or "none",
            micro_batch=options.micro_batch or 1, seq_len=options.seq_len,
        )  # fmt: skip
    return estimate_inference(
        shape, dtype=options.dtype, context=options.context, batch=options.batch or 1, tp=options.tp,
        kv_dtype=options.kv_dtype, flash_attention=options.flash_attention,
    )  # fmt: skip


def estimate_request_bytes(
    model: str | None,
    options: EstimateOptions | None = None,
    *,
    params: float | None = None,
    margin: float = DEFAULT_MARGIN,
) -> tuple[int, str]:
    """Bytes per GPU to request for ``model`` (estimate × (1 + margin), up to a whole MiB) and one line
    saying how: ``"llama-3-8b inference (bf16, …): 17.3 GiB per GPU + 10% margin = 19 GiB per GPU × 1"``.
    """
    if not 0 <= margin <= 1:
        raise InvalidEstimateOptions(f"margin {margin}: use a fraction from 0 to 1, e.g. 0.1 for 10 %")
    est = run_estimate(model, options or EstimateOptions(), params)
    need = est.total_bytes_per_gpu
    request = math.ceil(need * (1 + margin) / MiB) * MiB
    shown = ", ".join(f"{k} {v}" for k, v in est.settings.items() if v not in (False, None))
    text = (f"{est.model} {est.mode} ({shown}): {format_size(need)} per GPU + {margin:.0%} safety margin "
            f"= {format_size(request)} per GPU × {est.gpus} GPU{'s' if est.gpus > 1 else ''}")  # fmt: skip
    return request, text
