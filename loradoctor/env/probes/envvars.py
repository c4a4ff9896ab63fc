"""Environment variables that change how CUDA, torch and the HF stack behave. Secrets are never stored."""

from __future__ import annotations

import os
import re

NAMES = {
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CUDA_DEVICE_ORDER",
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK", "CUDA_LAUNCH_BLOCKING",
    "CUDA_MODULE_LOADING", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HOME", "HF_HUB_CACHE",
    "TRANSFORMERS_CACHE", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_FLASH_ATTENTION", "BNB_CUDA_VERSION",
    "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST", "OMP_NUM_THREADS", "WORLD_SIZE",
    "LOCAL_RANK", "TOKENIZERS_PARALLELISM",
}
PREFIXES = ("NCCL_", "TORCH_NCCL_", "PYTORCH_", "ACCELERATE_")
SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.I)


def probe(environ: "dict[str, str] | None" = None) -> dict[str, str]:
    """The `env_vars` section: relevant variables only, never anything that looks like a secret."""
    env = os.environ if environ is None else environ
    out = {}
    for name in sorted(env):
        if SECRET.search(name):
            continue
        if name in NAMES or name.startswith(PREFIXES):
            out[name] = env[name]
    return out
