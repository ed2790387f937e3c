"""vllm-tmaguard: makes vLLM start, and stay fast, on pods whose libcuda.so.1 is a GPU-sharing layer.

Kept empty on purpose: the .pth import hook imports this package at every interpreter start.
"""

__version__ = "0.1.0"
