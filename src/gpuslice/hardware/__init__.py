"""Plain data about machines: GPU models and node capacities."""

from gpuslice.hardware.gpu_models import GPU_MODELS, GpuModel, gpu_model
from gpuslice.hardware.node import MAX_GPUS_PER_NODE, NodeSpec

__all__ = ["GPU_MODELS", "MAX_GPUS_PER_NODE", "GpuModel", "NodeSpec", "gpu_model"]
