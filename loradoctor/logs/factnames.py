"""The fact names of docs/facts.md, shipped with the package (docs/ is not installed).

Rules may only use these names; tests/test_facts.py checks this list against docs/facts.md.
`BYTES_FACTS` are printed as sizes when a condition is explained.
"""

KNOWN_FACTS: tuple[str, ...] = (
    # oom
    "oom.count", "oom.era", "oom.device_index", "oom.requested_bytes", "oom.total_bytes", "oom.free_bytes",
    "oom.allocated_bytes", "oom.reserved_bytes", "oom.reserved_unallocated_bytes", "oom.private_pool_bytes",
    "oom.allowed_bytes", "oom.this_process_bytes", "oom.other_process_bytes", "oom.other_process_count", "oom.other_pids",
    "oom.other_unaccounted_bytes", "oom.non_pytorch_bytes", "oom.hint", "oom.phase", "oom.step",
    "oom.step_fraction", "oom.bar_phase",
    # memsum
    "memsum.count", "memsum.allocated_bytes", "memsum.peak_allocated_bytes", "memsum.reserved_bytes",
    "memsum.peak_reserved_bytes", "memsum.non_releasable_bytes", "memsum.reserved_unallocated_bytes",
    "memsum.alloc_retries", "memsum.oom_count",
    # metrics
    "metrics.steps", "metrics.first_loss", "metrics.last_loss", "metrics.min_loss", "metrics.max_loss",
    "metrics.loss_nan_count", "metrics.first_nonfinite_index", "metrics.finite_before_nan", "metrics.trailing_nan_count",
    "metrics.loss_zero_count", "metrics.loss_before_zero", "metrics.loss_range", "metrics.loss_flat_steps", "metrics.loss_rise_ratio",
    "metrics.loss_repeat_period", "metrics.loss_repeated_records",
    "metrics.grad_norm_first", "metrics.grad_norm_max", "metrics.grad_norm_nan_count",
    "metrics.grad_norm_growth", "metrics.lr_max", "metrics.lr_last", "metrics.eval_loss_last", "metrics.eval_loss_nonfinite",
    "metrics.train_finished", "metrics.train_loss", "metrics.train_runtime", "metrics.overflow_skips", "metrics.loss_scale_min", "metrics.mem_first_bytes",
    "metrics.mem_last_bytes", "metrics.mem_max_bytes", "metrics.mem_growth_ratio",
    "metrics.mem_rising_records", "metrics.precision", "metrics.summary_only",
    "metrics.reward_std_records", "metrics.reward_std_max", "peft.trainable_params", "peft.all_params", "peft.last_trainable_params",
    # trace
    "trace.count", "trace.exception", "trace.message", "trace.location", "trace.bnb_4bit", "trace.raised_in",
    # config
    "config.load_in_4bit", "config.gradient_checkpointing", "config.micro_batch_size", "config.learning_rate",
    "config.quantized",
    # xid
    "xid.count", "xid.numbers", "xid.first", "xid.pci", "xid.pid", "xid.process", "xid.fell_off_bus",
    # smi
    "smi.unlisted_bytes", "smi.unlisted_large", "smi.gpu_index", "smi.used_bytes", "smi.total_bytes", "smi.process_count",
    # dist
    "dist.child_failed", "dist.failed_rank", "dist.exit_code", "dist.signal", "dist.timeout_count",
    "dist.timeout_ranks", "dist.first_timeout_rank", "dist.timeout_ms", "dist.ranks", "dist.nccl_error_count",
    "dist.world_size", "dist.silent_ranks",
    # killed
    "killed.oom_killer", "killed.pid", "killed.process", "killed.anon_rss_bytes", "killed.bare",
    "killed.exit_code",
    # code43
    "prose.oom_phase", "prose.gpu_oom", "prose.memory_growth", "code43.present", "code43.device",
    # card
    "card.blackwell", "card.pre_volta",
    # input
    "input.files", "input.lines", "input.bytes",
    # env
    "env.present", "env.gpu_name", "env.compute_capability", "env.gpu_total_bytes", "env.other_process_bytes",
    "env.torch_cuda_available", "env.torch_cuda_version", "env.driver_version",
)

KNOWN_FACT_SET = frozenset(KNOWN_FACTS)

# What an env check found, as the fix conditions of the cause catalogue (loradoctor/data/causes.yaml) name it:
# a check's facts and wording values `name` are `check.name` there (`when: check.no_gpu`); docs/rules.md
# "Conditions on a fix". Only these may be named, so a misspelt one is refused when the catalogue loads.
CHECK_FACTS: tuple[str, ...] = (
    "check.no_gpu", "check.cpu_build", "check.needs_torch",  # gpu_training: why GPU fine-tuning is not possible here
    "check.shadows",  # torch_broken: LD_LIBRARY_PATH lists CUDA library folders
    "check.no_wheel",  # arch_unsupported: no current torch wheel has kernels for the GPU
    "check.needs_package",  # version_conflict: the floor names a package other than torch (needs_torch: torch)
)
CHECK_FACT_SET = frozenset(CHECK_FACTS)
CHECK_GROUP = "check"
BYTES_FACTS = frozenset(n for n in KNOWN_FACTS if n.endswith("_bytes"))
FRACTION_FACTS = frozenset({"oom.step_fraction"})


def group_of(name: str) -> str:
    """`oom.requested_bytes` -> `oom`; `peft.*` facts belong to the metrics group's lines."""
    return name.split(".", 1)[0]
