"""The tables the extractors read, as plain data: extend a table here, not the code that reads it.
(Traceback frame names -> phase live in loradoctor/data/frames.yaml, read by facts/frames.py.)

- `SPACED_KEYS`, `BAR_LOSS_KEYS`, `TABLE_KEYS`, `WANDB_KEYS`: metric names as trainers print them ->
  the keys of a metric record (`loss`, `grad_norm`, `learning_rate`, ...).
- `OOM_FIGURE_FIELDS`: the figure labels of the memory-fraction OOM form -> OomMessage fields.
- `ERRORISH_WORDS`: what makes a line look like an error (the tail shown when nothing is recognised).
"""

# metrics: names as printed -> metric record keys
# `Iter 75: Train loss 3.316, Learning Rate 1.000e-04` (mlx-lm), `step 100 | loss 2.31 | lr 2e-4`
SPACED_KEYS = {"train loss": "loss", "training loss": "loss", "loss": "loss", "learning rate": "learning_rate",
               "lr": "learning_rate", "grad norm": "grad_norm", "gnorm": "grad_norm"}
# the postfix key of a tqdm bar that holds the loss (Lightning's `train_loss=`, kohya's `avr_loss=`), first wins
BAR_LOSS_KEYS = ("loss", "train_loss", "avr_loss", "avg_loss", "train/loss")
# series keys as loops print them, any case (timm's `Loss:` / `LR:`, a recased paste's `Loss:`,
# fairseq's `gnorm`) -> the record keys the aggregates read
SERIES_KEYS = {"loss": "loss", "lr": "lr", "learning_rate": "learning_rate", "grad_norm": "grad_norm",
              "gnorm": "grad_norm", "grad_norm_total": "grad_norm"}
# the columns of a notebook Trainer table
TABLE_KEYS = {"step": "step", "epoch": "epoch", "training loss": "loss", "train loss": "loss",
              "validation loss": "eval_loss", "eval loss": "eval_loss", "grad norm": "grad_norm",
              "learning rate": "learning_rate", "reward_std": "reward_std"}
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
                  "core dumped", "out of memory", "nccl", "xid",
                  # torch's dispatch refusal pasted without its `RuntimeError:` (`"addmm_impl_cpu_" not implemented for 'Half'`)
                  "not implemented for '")
