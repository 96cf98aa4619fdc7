"""``gpuslice estimate MODEL``: an LLM's GPU memory per component, and the slice that holds it.

Parse, call ``estimate.request.run_estimate`` and ``estimate.fit.fit_slice``, present a table or JSON.
User errors are UserErrors; the root app turns them into one line and exit 2. The option types below
are public so that ``gpuslice submit --estimate`` can declare the same options.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from gpuslice.cli import terminal
from gpuslice.estimate import BUNDLED, RECOMPUTE, WEIGHT_DTYPES, EstimateOptions, fit_slice, run_estimate
from gpuslice.estimate.fit import SliceFit
from gpuslice.estimate.result import Estimate
from gpuslice.hardware.gpu_models import GPU_MODELS
from gpuslice.units import format_size

__all__ = [
    "Batch", "Context", "Dtype", "FlashAttention", "Gpus", "KvDtype", "MicroBatch", "Params", "Recompute",
    "SeqLen", "TensorParallel", "Train", "Zero", "estimate", "print_estimate",
]  # fmt: skip

Params = Annotated[float | None, typer.Option(help="Bare parameter count, e.g. 7.5e9 (model states only).")]
Train = Annotated[bool, typer.Option("--train/--infer", help="Training (Adam) instead of inference.")]
Dtype = Annotated[
    str, typer.Option(help=f"Weights: {', '.join(WEIGHT_DTYPES)} (training: bf16, fp16, fp32).")
]
_MAX_TOKENS = 2**24  # 16.8M tokens: beyond any model's context
_MAX_COUNT = 2**16  # sequences, GPUs: beyond any one job
TensorParallel = Annotated[
    int, typer.Option("--tp", min=1, max=1024, help="Tensor-parallel GPUs, 1..1024; must divide the heads.")
]
Context = Annotated[
    int | None, typer.Option(min=1, max=_MAX_TOKENS, help="Inference: tokens per sequence (default 4096).")
]
Batch = Annotated[
    int | None,
    typer.Option(
        min=1, max=_MAX_COUNT, help=f"Inference: sequences cached at once, 1..{_MAX_COUNT} (default 1)."
    ),
]
KvDtype = Annotated[str | None, typer.Option(help="Inference: KV cache fp32, bf16, fp16 or fp8.")]
FlashAttention = Annotated[bool, typer.Option(help="Inference: fused attention, no context² score matrix.")]
Gpus = Annotated[
    int | None, typer.Option(min=1, max=_MAX_COUNT, help="Training: GPUs in all (data parallel = gpus / tp).")
]
Zero = Annotated[int | None, typer.Option(min=0, max=3, help="Training: ZeRO stage 0-3 (default 0).")]
Recompute = Annotated[str | None, typer.Option(help=f"Training: recomputation {'|'.join(RECOMPUTE)}.")]
MicroBatch = Annotated[
    int | None, typer.Option(min=1, max=_MAX_COUNT, help="Training: sequences per micro-batch.")
]
SeqLen = Annotated[
    int | None, typer.Option(min=1, max=_MAX_TOKENS, help="Training: tokens per sequence (default 4096).")
]

_MODELS = ", ".join(BUNDLED)


def estimate(
    model: Annotated[
        str | None, typer.Argument(help=f"Bundled model ({_MODELS}) or a path to a config.json.")
    ] = None,
    params: Params = None,
    train: Train = False,
    dtype: Dtype = "bf16",
    tp: TensorParallel = 1,
    context: Context = None,
    batch: Batch = None,
    kv_dtype: KvDtype = None,
    flash_attention: FlashAttention = False,
    gpus: Gpus = None,
    zero: Zero = None,
    recompute: Recompute = None,
    micro_batch: MicroBatch = None,
    seq_len: SeqLen = None,
    as_json: Annotated[bool, typer.Option("--json", help="Every component in bytes, as JSON.")] = False,
) -> None:
    """Estimate a model's GPU memory for inference or training, and the smallest slice that holds it."""
    options = EstimateOptions(
        train=train, dtype=dtype, tp=tp, context=context, batch=batch, kv_dtype=kv_dtype,
        flash_attention=flash_attention, gpus=gpus, zero=zero, recompute=recompute,
        micro_batch=micro_batch, seq_len=seq_len,
    )  # fmt: skip
    result = run_estimate(model, options, params)
    fit = fit_slice(result.total_bytes_per_gpu, result.gpus)
    if as_json:
        typer.echo(json.dumps({**result.as_dict(), "slice": fit.as_dict()}, indent=2))
    else:
        print_estimate(terminal.console(), result, fit)


def print_estimate(console: Console, result: Estimate, fit: SliceFit) -> None:
    """The component table, the per-GPU total, the ``--mem`` value and the catalogue entries that fit."""
    settings = ", ".join(f"{k} {v}" for k, v in result.settings.items() if v is not False)
    active = (
        f" ({result.active_parameters / 1e9:.2f}B active)"
        if result.active_parameters != result.parameters
        else ""
    )
    head = f"{result.model}: {result.parameters / 1e9:.2f}B parameters{active}, {result.mode}, {settings}"
    console.print(head, markup=False, highlight=False)
    console.print(f"parameters: {result.parameter_source}", markup=False, highlight=False)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("component")
    table.add_column("per GPU", justify="right")
    table.add_column("how", overflow="fold")
    for c in result.components:
        table.add_row(c.label, format_size(c.bytes_per_gpu), c.note)
    table.add_section()
    table.add_row(
        "total per GPU", format_size(result.total_bytes_per_gpu), f"{result.total_bytes_per_gpu:,} B"
    )
    console.print(table)
    per = f" per GPU × {fit.gpus} GPUs" if fit.gpus > 1 else ""
    console.print(f"smallest slice: --mem {fit.mem}{per}", markup=False, highlight=False)
    held = ", ".join(GPU_MODELS[name].vendor_name for name in fit.gpu_models)
    console.print(f"GPU models that hold it: {held or 'none in the catalogue'}",
                  markup=False, highlight=False)  # fmt: skip
    if fit.gpus == 1:
        console.print(f"MIG profiles that hold it: {', '.join(fit.mig_profiles) or 'none'}",
                      markup=False, highlight=False)  # fmt: skip
    if not fit.gpu_models:
        console.print("hint: split the model with --tp (inference) or ZeRO/--tp over --gpus (training)",
                      markup=False, highlight=False)  # fmt: skip
