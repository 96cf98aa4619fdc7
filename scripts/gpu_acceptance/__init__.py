"""The GPU acceptance run (``scripts/gpu-acceptance``): every GPU path of gpuslice against a real NVIDIA GPU.

Modules, one stage family each: ``runner`` (stages, time limits, the JSON and the table), ``smi``
(nvidia-smi output parsed and compared with gpuslice's NVML readings), ``serve_check`` (``gpuslice serve``
with real PyTorch jobs under each sharing mode), ``um`` (unified-memory microbenchmarks, the cost profile
built from them, memsim on the same sweeps) and ``um_worker`` (the CUDA side, run in its own process).
"""
