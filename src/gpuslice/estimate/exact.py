"""An exact parameter count of a config.json by building the model on PyTorch's meta device.

This is what accelerate's ``estimate-memory`` does: transformers builds the model from its config with
every tensor on the ``meta`` device (shapes, no storage), and the parameters are counted, tied weights
once. It needs ``transformers`` and ``torch``, which gpuslice does not depend on: without them (or for
an architecture transformers does not know) ``exact_parameter_count`` returns None and the estimator
uses its own per-family formulas, which tests/estimate keeps within 0.5 % of counts made this way
(scripts/make_estimator_reference.py writes them).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["exact_parameter_count", "transformers_available"]

_ENCODERS = {"bert", "roberta"}  # AutoModel, with the pooler, as accelerate counts them
_SEQ2SEQ = {"t5"}


def transformers_available() -> bool:
    """Whether transformers and torch import here."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def exact_parameter_count(data: dict[str, Any]) -> int | None:
    """Parameters of the model a parsed config.json describes, counted by transformers on the meta
    device; None when transformers or torch is missing or transformers cannot build this config."""
    if not transformers_available():
        return None
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    model_type = str(data.get("model_type", ""))
    auto = (
        AutoModel
        if model_type in _ENCODERS
        else (AutoModelForSeq2SeqLM if model_type in _SEQ2SEQ else AutoModelForCausalLM)
    )
    try:
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "config.json").write_text(json.dumps(data))
            config = AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            model = auto.from_config(config)
    except Exception:  # an architecture transformers does not know, or a config it refuses
        return None
    return sum(p.numel() for p in model.parameters())
