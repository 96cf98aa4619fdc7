"""The estimator's user errors, all ``gpuslice.errors.UserError`` subclasses (CLI exit 2).

```text
UserError
├─ UnknownModel            a model name is neither bundled nor a path to a config.json
├─ MalformedModelConfig    a config.json cannot be read as a transformer (names the file and the field)
└─ InvalidEstimateOptions  options that contradict each other or the model (ZeRO without --train,
                           a tensor-parallel degree that does not divide the heads, …)
```
"""

from __future__ import annotations

from gpuslice.errors import UnknownName, UserError

__all__ = ["InvalidEstimateOptions", "MalformedModelConfig", "UnknownModel"]


class UnknownModel(UnknownName):
    """A model name is not bundled and is not a path to a config.json; the message lists the known names."""


class MalformedModelConfig(UserError):
    """A Hugging Face config.json is unreadable or lacks a field; the message names the file and the field."""


class InvalidEstimateOptions(UserError):
    """Estimate options contradict each other or the model's shape; the message says which and how to fix."""
