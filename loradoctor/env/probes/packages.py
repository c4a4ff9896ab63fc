"""Package versions from importlib.metadata: nothing is imported, so a broken package cannot hurt us.

Standalone (stdlib only) so that `loradoctor env --python PATH` can run it in another interpreter."""

from __future__ import annotations

import importlib.metadata as md
import re

WATCHED = {
    "torch": ["torch"], "transformers": ["transformers"], "peft": ["peft"], "accelerate": ["accelerate"],
    "trl": ["trl"], "bitsandbytes": ["bitsandbytes"], "flash-attn": ["flash-attn", "flash_attn"],
    "flash-attn-3": ["flash-attn-3", "flash_attn_3"], "xformers": ["xformers"], "deepspeed": ["deepspeed"],
    "triton": ["triton", "pytorch-triton"], "datasets": ["datasets"], "safetensors": ["safetensors"],
    "tokenizers": ["tokenizers"], "unsloth": ["unsloth"], "torchvision": ["torchvision"], "numpy": ["numpy"],
}
NVIDIA_WHEEL = re.compile(r"^nvidia-(cudnn|cublas|nccl|cuda-runtime|cuda-nvrtc|cusparse|cufft|nvjitlink)(-cu\d+)?$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.lower())


def probe() -> dict[str, str]:
    """The `packages` section: {name: version} for the watched packages and nvidia-* CUDA wheels that are installed."""
    out: dict[str, str] = {}
    for key, dists in WATCHED.items():
        for dist in dists:
            try:
                out[key] = md.version(dist)
                break
            except md.PackageNotFoundError:
                continue
    for dist in md.distributions():
        name = _norm(dist.metadata.get("Name") or "")
        if NVIDIA_WHEEL.match(name):
            out.setdefault(name, dist.version)
    return dict(sorted(out.items()))


if __name__ == "__main__":  # run as a child of another interpreter (`loradoctor env --python PATH`)
    import json

    print(json.dumps(probe()))
