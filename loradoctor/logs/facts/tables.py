"""The tables the extractors read, as plain data: extend a table here, not the code that reads it.

- `LOCATIONS`, `STEP_FRAMES`, `MOVE_FRAMES`: traceback frame names -> the phase a failure happened in
  (trace.location, oom.phase).
- `SPACED_KEYS`, `BAR_LOSS_KEYS`, `TABLE_KEYS`, `WANDB_KEYS`: metric names as trainers print them ->
  the keys of a metric record (`loss`, `grad_norm`, `learning_rate`, ...).
- `OOM_FIGURE_FIELDS`: the figure labels of the memory-fraction OOM form -> OomMessage fields.
- `ERRORISH_WORDS`: what makes a line look like an error (the tail shown when nothing is recognised).
"""

# trace.location: phases by frame name
LOCATIONS = (  # checked in this order: the more specific phase wins
    ("load", {"from_pretrained", "load_state_dict", "_load_state_dict_into_meta_model", "dispatch_model",
              "load_checkpoint_and_dispatch", "_load_pretrained_model", "load_checkpoint_in_model",
              "_load_from_state_dict", "load_model",
              # quantization while loading (bitsandbytes 4/8-bit, transformers' quantizers)
              "create_quantized_param", "_process_model_before_weight_loading", "replace_with_bnb_linear",
              "quantize_4bit", "_quantize", "load_and_quantize_model"}),
    # merging an adapter into the base weights (a quantized base is dequantized first)
    ("merge", {"merge_and_unload", "_unload_and_optionally_merge", "merge_adapter", "add_weighted_adapter",
               "merge_lora_weights", "_merge_lora"}),
    # save: HF Trainer / PEFT, plus the frames of a sharded save without Trainer frames above them
    # (DeepSpeed's engine and ZeRO-3 16-bit consolidation, FSDP full / optimizer state dicts via
    # accelerate or torch, torch.distributed.checkpoint, Lightning, torch.save itself)
    ("save", {"save_model", "_save_checkpoint", "save_pretrained", "_save", "save_state",
              "save_checkpoint", "save_16bit_model", "_zero3_consolidated_16bit_state_dict",
              "_save_zero_checkpoint", "consolidate_state_dict", "save_fsdp_model", "save_fsdp_optimizer",
              "get_state_dict", "_full_post_state_dict_hook", "full_optim_state_dict", "_optim_state_dict_impl",
              "get_model_state_dict", "get_optimizer_state_dict", "save_state_dict", "_save_state_dict",
              "async_save", "dump_checkpoint", "save"}),
    ("eval", {"evaluate", "evaluation_loop", "prediction_step", "_evaluate", "predict",
              # predictions accumulated on the GPU (Trainer without eval_accumulation_steps)
              "prediction_loop", "nested_concat", "_nested_gather", "gather_for_metrics", "eval_step",
              # Lightning: validation (and the sanity check before training)
              "validation_step", "_evaluation_step", "_run_sanity_check", "validate",
              # diffusers / kohya: validation images between steps
              "log_validation", "sample_images", "sample_image_inference"}),
    ("generate", {"generate", "_sample", "greedy_search", "sample", "beam_search", "_greedy_search", "_beam_search",
                  "_beam_sample", "_group_beam_search", "_constrained_beam_search", "_assisted_decoding",
                  "_contrastive_search"}),
    ("optimizer", {"optimizer_step"}),
    ("backward", {"backward", "_engine_run_backward", "run_backward"}),
    ("forward", {"forward", "_call_impl", "_wrapped_call_impl", "compute_loss", "training_step"}),
)
# frames that show a training step is under way; a bare `train` is not one (kohya's `train`
# function loads the model too)
STEP_FRAMES = {"_inner_training_loop", "training_step", "train_step", "compute_loss", "forward", "backward",
               "_engine_run_backward", "optimizer_step", "_call_impl", "_wrapped_call_impl"}
SPECIFIC_PHASES = ("load", "merge", "save", "eval", "generate")
# frames that move a model to the GPU: load, when no training-step frame is in the traceback
MOVE_FRAMES = {"to", "cuda", "_apply"}

# metrics: names as printed -> metric record keys
# `Iter 75: Train loss 3.316, Learning Rate 1.000e-04` (mlx-lm), `step 100 | loss 2.31 | lr 2e-4`
SPACED_KEYS = {"train loss": "loss", "training loss": "loss", "loss": "loss", "learning rate": "learning_rate",
               "lr": "learning_rate", "grad norm": "grad_norm", "gnorm": "grad_norm"}
# the postfix key of a tqdm bar that holds the loss (Lightning's `train_loss=`, kohya's `avr_loss=`), first wins
BAR_LOSS_KEYS = ("loss", "train_loss", "avr_loss", "avg_loss", "train/loss")
# the columns of a notebook Trainer table
TABLE_KEYS = {"step": "step", "epoch": "epoch", "training loss": "loss", "train loss": "loss",
              "validation loss": "eval_loss", "eval loss": "eval_loss", "grad norm": "grad_norm",
              "learning rate": "learning_rate"}
# the keys of a `wandb: Run summary:` block
WANDB_KEYS = {"train/loss": "loss", "loss": "loss", "train/grad_norm": "grad_norm", "grad_norm": "grad_norm",
              "train/learning_rate": "learning_rate", "learning_rate": "learning_rate", "eval/loss": "eval_loss",
              "eval_loss": "eval_loss", "train/epoch": "epoch", "train/global_step": "step",
              "train_runtime": "train_runtime"}

# oom: the figure lines of `Allocation on device N would exceed allowed memory`
OOM_FIGURE_FIELDS = {"Currently allocated": "allocated_bytes", "Requested": "requested_bytes",
                     "Device limit": "total_bytes", "Free (according to CUDA)": "free_bytes", "PyTorch limit": "allowed_bytes"}

# Words that make a line "error-looking" (shown when nothing is recognised), matched on the lower-cased
# line with plain `in` tests: a case-insensitive regex alternation cost ~25 us a line, most of the
# collector's time on a busy log.
ERRORISH_WORDS = ("error", "exception", "traceback", "fail", "fatal", "killed", "abort", "segmentation fault",
                  "core dumped", "out of memory", "nccl", "xid")
