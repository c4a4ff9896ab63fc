"""More than one GPU: what each GPU holds under DDP, FSDP (full / hybrid sharding) and DeepSpeed ZeRO-2 / ZeRO-3,
with and without CPU offload. Pure arithmetic on the single-GPU model states.

Per GPU (N GPUs; FSDP hybrid shards within a node of up to 8 GPUs and replicates across nodes):

* DDP: a full replica; the reducer copies every gradient into its flat buckets (``gradient_as_bucket_view``
  is off by default), so trainable gradients count twice.
* ZeRO-2: parameters replicated; gradients and optimizer states partitioned (1/N), plus the contiguous
  gradient bucket DeepSpeed allocates at the start of every backward (``reduce_bucket_size`` elements in the
  half dtype, two buffers with ``overlap_comm``, however few parameters are trained; Hugging Face's ``auto``
  fills in hidden x hidden). ``offload_optimizer`` moves the optimizer states (and the fp32 master copy)
  to the host.
* ZeRO-3 / FSDP: parameters, gradients and optimizer states partitioned (1/N); a layer is all-gathered for
  its forward and backward while the next one is prefetched (two layers' parameters in the compute dtype)
  and one layer's full gradient exists before its reduce-scatter. ``offload params`` keeps only those
  gathered layers on the GPU (the optimizer is offloaded with them).
* NCCL communicators allocate their buffers outside PyTorch's allocator: a fixed 256 MiB of device memory
  (it varies with the number of channels and peers).

DeepSpeed's ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_...`` count model states only (for
full fine-tuning: ZeRO-2 4 P + 16 P / N bytes, ZeRO-3 4 x largest layer + 18 P / N); loradoctor counts the whole
step: these model states, plus activations, the loss, buckets and gathered layers, the allocator and the
context (`deepspeed_model_states_bytes` reproduces DeepSpeed's numbers for comparison).
"""

from __future__ import annotations

from loradoctor.record import record

from loradoctor.errors import UserError

MIB = 1 << 20
STRATEGIES = ("none", "ddp", "fsdp", "fsdp-hybrid", "zero2", "zero3")
OFFLOADS = ("none", "optimizer", "params")
NCCL_BYTES = 256 * MIB
GPUS_PER_NODE = 8


def normalize_strategy(text: str) -> str:
    key = str(text or "none").strip().lower().replace("_", "-")
    key = {"zero-2": "zero2", "zero-3": "zero3", "deepspeed-zero2": "zero2", "deepspeed-zero3": "zero3",
           "full-shard": "fsdp", "fsdp-full": "fsdp", "hybrid-shard": "fsdp-hybrid", "hybrid": "fsdp-hybrid",
           "single": "none", "": "none"}.get(key, key)
    if key not in STRATEGIES:
        raise UserError(f"--strategy must be one of {', '.join(STRATEGIES)}, not {text!r}")
    return key


def validate_parallel(gpus: int, strategy: str, offload: str) -> None:
    if gpus < 1:
        raise UserError("--gpus must be at least 1")
    if offload not in OFFLOADS:
        raise UserError(f"--offload must be one of {', '.join(OFFLOADS)}, not {offload!r}")
    if offload != "none" and strategy in ("none", "ddp"):
        raise UserError(f"--offload {offload} needs a sharding strategy (--strategy zero2, zero3 or fsdp)")
    if offload == "params" and strategy == "zero2":
        raise UserError("--offload params needs ZeRO-3 or FSDP (ZeRO-2 keeps every parameter on each GPU)")


def shard_count(strategy: str, gpus: int) -> int:
    """Over how many GPUs the sharded states are split."""
    if strategy == "fsdp-hybrid":
        return min(gpus, GPUS_PER_NODE)
    if strategy in ("fsdp", "zero2", "zero3"):
        return gpus
    return 1


@record(frozen=True)
class PerGpu:
    """Bytes on one GPU. weights: frozen/base parameters (incl. full fine-tuning's parameters); trainable: the
    adapters' own parameters; gathered: all-gathered layers and their unsharded gradient; buckets: DDP /
    ZeRO gradient buckets; comm: NCCL buffers (device memory, outside the allocator)."""

    weights: int
    trainable: int
    grads: int
    optimizer: int
    gathered: int
    buckets: int
    comm: int


def per_gpu(strategy: str, gpus: int, offload: str, *, weights: int, trainable: int, grads: int, optimizer: int,
            layer_bytes: int, layer_grad_bytes: int, bucket_bytes: int) -> PerGpu:
    """The single-GPU model states -> what one of `gpus` GPUs holds under `strategy` (see the module doc).
    layer_bytes: one decoder layer's parameters in the compute dtype (what an all-gather materialises);
    layer_grad_bytes: that layer's trainable gradient before reduce-scatter; bucket_bytes: the ZeRO-2
    contiguous gradient bucket(s), allocated whole (DeepSpeed does not size them to the gradients)."""
    comm = NCCL_BYTES if gpus > 1 else 0
    n = shard_count(strategy, gpus)
    if strategy == "none":
        return PerGpu(weights, trainable, grads, optimizer, 0, 0, comm)
    if strategy == "ddp":
        return PerGpu(weights, trainable, grads, optimizer, 0, grads, comm)
    opt = 0 if offload in ("optimizer", "params") else -(-optimizer // n)
    if strategy == "zero2":
        grads_gpu = 0 if offload == "optimizer" else -(-grads // n)
        return PerGpu(weights, trainable, grads_gpu, opt, 0, bucket_bytes, comm)
    # zero3 / fsdp / fsdp-hybrid: everything partitioned, two layers gathered (current + prefetch)
    gathered = 2 * layer_bytes + layer_grad_bytes
    if offload == "params":
        return PerGpu(0, 0, 0, 0, gathered, 0, comm)
    grads_gpu = 0 if offload == "optimizer" else -(-grads // n)
    return PerGpu(-(-weights // n), -(-trainable // n), grads_gpu, opt, gathered, 0, comm)


def deepspeed_model_states_bytes(stage: int, total_params: int, largest_layer_params: int, gpus: int,
                                 offload_optimizer: bool = False, offload_params: bool = False) -> int:
    """DeepSpeed's own estimators (deepspeed.runtime.zero.stage_1_and_2 / stage3
    estimate_zero{2,3}_model_states_mem_needs, per GPU, one node): model states of full fine-tuning only."""
    p = total_params
    if stage == 2:
        return 2 * p if offload_optimizer else 4 * p + 16 * p // gpus
    largest = 4 * largest_layer_params
    if offload_params:
        return largest
    if offload_optimizer:
        return largest + 2 * p // gpus
    return largest + 18 * p // gpus
