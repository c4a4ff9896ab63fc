"""loradoctor: the offline doctor for LoRA / QLoRA fine-tuning runs."""

__version__ = "0.1.0"


def watch(out: str = "loradoctor-run", record_memory_history: bool = False):
    """Watch a plain training loop: `with loradoctor.watch() as doc: ... doc.step(step=i, loss=loss)`.
    See loradoctor/integrations/watch.py. Imports nothing heavy until called."""
    from loradoctor.integrations.watch import watch as _watch

    return _watch(out=out, record_memory_history=record_memory_history)
