"""loradoctor: the offline doctor for LoRA / QLoRA fine-tuning runs."""

__version__ = "0.1.0"
