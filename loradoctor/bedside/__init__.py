"""The doctor at the bedside: watch a training run while it happens.

- `timeline.py`  the record format (JSON lines, flushed as written) and a bounded reader;
- `sampler.py`   a thread that samples GPUs (NVML) and the process tree (psutil) into a timeline;
- `runner.py`    `loradoctor run -- CMD`: the child in its own process group, output passed through
                 and teed to run.log, signals forwarded, the exit code kept;
- `diagnose.py`  pure: timeline records -> findings (leak, other process, host RAM, slow training);
- `picture.py`   a self-contained SVG of the run; `report.py` report.md.

The Trainer callback and `loradoctor.watch()` (loradoctor/integrations/) write the same timeline
from inside the training process. Nothing here imports torch at loradoctor's import time.
"""
