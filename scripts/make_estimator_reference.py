"""Exact parameter counts for the estimator's reference configs, by instantiating each model on the meta
device with Hugging Face transformers (what accelerate's ``estimate-memory`` does): no weights are
downloaded or allocated.

    python3 -m venv .venv-ref && .venv-ref/bin/pip install torch transformers
    .venv-ref/bin/python scripts/make_estimator_reference.py

reads every ``tests/estimate/configs/families/*.json`` and writes
``tests/estimate/configs/families/reference_counts.json``: per config, its parameter count as
``gpuslice.estimate.exact`` makes it (``sum(p.numel() for p in model.parameters())``, tied weights
once), and the transformers and torch versions. The tests compare gpuslice's own formulas with these
counts, so they need neither torch nor transformers.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # gpuslice's own exact path, without installing it here

from gpuslice.estimate.exact import exact_parameter_count  # noqa: E402

FAMILIES = ROOT / "tests" / "estimate" / "configs" / "families"


def count(config_path: Path) -> dict[str, object]:
    data = json.loads(config_path.read_text())
    parameters = exact_parameter_count(data)
    if parameters is None:
        raise SystemExit(f"{config_path}: transformers could not build this config")
    return {"model_type": data["model_type"], "parameters": parameters}


def main() -> None:
    results = {}
    for path in sorted(FAMILIES.glob("*.json")):
        if path.name == "reference_counts.json":
            continue
        started = time.perf_counter()
        results[path.stem] = count(path)
        print(f"{path.stem}: {results[path.stem]} ({time.perf_counter() - started:.1f} s)", file=sys.stderr)
    out = {
        "made_by": "scripts/make_estimator_reference.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "counts": results,
    }
    (FAMILIES / "reference_counts.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
