"""config: what the log says the run already uses, so that a fix already applied is not offered again
(a rule's `fixes:` item with `unless:`). `config.load_in_4bit`: `load_in_4bit=True` in a
BitsAndBytesConfig / argument dump / YAML or JSON config echo; `config.gradient_checkpointing`:
`gradient_checkpointing=True` (TrainingArguments dump, config echo), transformers' warning that
`use_cache=True` is incompatible with gradient checkpointing, or a traceback frame in
torch/utils/checkpoint.py; `config.micro_batch_size`: the Trainer's `Instantaneous batch size per device = N`,
`per_device_train_batch_size=N` or axolotl's `micro_batch_size: N`; `config.learning_rate`: the configured
learning rate of a command line (`--learning_rate 3e-4`, `--learning_rate=0.003`), an argument dump or a config
echo (`learning_rate: 0.0003`, `learning_rate=0.0003`), never a metric record's scheduled value, or kohya's
`--unet_lr` / `--text_encoder_lr` where one is higher (the highest configured rate);
`config.quantized`: the log shows the model loaded (or meant to be loaded) quantized with bitsandbytes:
`load_in_4bit` / `load_in_8bit` set, a BitsAndBytesConfig or quantization_config, `bnb_4bit_*` settings, a
`-bnb-4bit` checkpoint, LLaMA-Factory's `quantization_bit`, QLoRA named, bitsandbytes named (not as a version in a
package list) or its layers and loader functions in a traceback. (bitsandbytes' 4-bit compute frames are
trace.bnb_4bit.)"""

from __future__ import annotations

import re
from typing import Any

from loradoctor.lazyre import lazy_re
from loradoctor.logs.facts.common import MAX_ID, Extractor, _bounded_int

# `load_in_4bit=True`, `"load_in_4bit": true`, `load_in_4bit: true`, `_load_in_4bit=True` (a quantization
# config repr), `--load_in_4bit True`; not `=False`, not `bnb_4bit_...`
_FOUR_BIT_RE = lazy_re(r"load_in_4bit[\"']?\s*(?:[:=]\s*|\s)[\"']?(?:true|1)\b", re.I)
_CHECKPOINTING_RE = lazy_re(r"(?<![\w.])gradient_checkpointing[\"']?\s*(?:[:=]\s*|\s)[\"']?(?:true|1)\b"
                               r"|is incompatible with gradient checkpointing"
                               r"|torch[/\\]utils[/\\]checkpoint\.py", re.I)

# quantized loading shown (config.quantized): the settings, the config class, a pre-quantized checkpoint's name,
# QLoRA named, bitsandbytes named (its warnings, its frames) but not as a version in a package list
# (`bitsandbytes==0.43.1`, `bitsandbytes 0.43.1`, `bitsandbytes version: 0.43.1`), its layers and the loader's
# quantizing functions; not `load_in_8bit=False`, not `quantization_config=None`
_QUANTIZED_RE = lazy_re(r"load_in_[48]bit[\"']?\s*(?:[:=]\s*|\s)[\"']?(?:true|1)\b|BitsAndBytesConfig|"
                           r"quantization_config[\"']?\s*[:=]\s*(?!None\b|null\b)[\w{(]|bnb_4bit_\w+[\"']?\s*[:=]|"
                           r"\bbnb[-_][48]bit\b|quantization_bit[\"']?\s*(?:[:=]\s*|\s)[48]\b|(?<![a-z])q-?lora(?![a-z])|"
                           r"bitsandbytes(?!(?:\s+version)?\s*(?:[=<>~!]=|:|\s)\s*v?\d)|\bLinear[48]bit(?:Lt)?\b|"
                           r"\bParams4bit\b|replace_with_bnb_linear|create_quantized_param", re.I)

# `  Instantaneous batch size per device = 4`, `per_device_train_batch_size=4`, `"per_device_train_batch_size": 4`,
# `micro_batch_size: 4` (axolotl)
_MICRO_BATCH_RE = lazy_re(r"(?:Instantaneous batch size per device =|(?<![\w.])(?:per_device_train_batch_size|micro_batch_size)"
                             r"[\"']?\s*[:=])\s*(\d{1,7})\b", re.I)

# `--learning_rate 3e-4`, `--learning_rate=0.003`, `--learning-rate 1e-4`, `learning_rate: 0.0003` (a params or
# YAML echo), `learning_rate=0.0003` (a TrainingArguments repr); a metric record (`'learning_rate': 3e-05`, quoted
# key) is the scheduler's current value, not the configured one, and is not read (see _METRIC_RECORD)
_LEARNING_RATE_RE = lazy_re(r"(?:--learning[_-]rate(?:\s*=\s*|\s+)|(?<![\w.'\"-])learning_rate\s*[:=]\s*)[\"']?"
                            r"((?<![\d.])\d{1,3}(?:\.\d{1,12})?(?:e-?\d{1,2})?|\.\d{1,12})(?![\w.])", re.I)
_METRIC_RECORD = ("'loss'", '"loss"', "'learning_rate'", '"learning_rate"')
# kohya sd-scripts' separate rates of the two networks (`--unet_lr=1e-4 --text_encoder_lr=5e-3`, `text_encoder_lr
# = 5e-3` in a TOML): config.learning_rate is the highest configured one (a 5e-3 text-encoder rate diverges whatever
# the U-Net's)
_NETWORK_LR_RE = lazy_re(r"(?:--|(?<![\w-]))(?:unet|text_encoder)_lr(?:\s*[:=]\s*|\s+)[\"']?"
                         r"((?<![\d.])\d{1,3}(?:\.\d{1,12})?(?:e-?\d{1,2})?|\.\d{1,12})(?![\w.])", re.I)


class ConfigExtractor(Extractor):
    TRIGGERS = (("load_in_4bit", True), ("gradient_checkpointing", True),
                ("incompatible with gradient checkpointing", True), ("checkpoint.py", True),
                ("batch size per device", True), ("per_device_train_batch_size", True), ("micro_batch_size", True),
                # not `learning_rate` alone: every Trainer metric dict holds `'learning_rate': `, and a trigger
                # there keeps the dicts in the scanned text (a 200 MB log took 4x as long)
                ("--learning", True), ("learning_rate:", True), ("learning_rate=", True), ("learning_rate :", True),
                ("learning_rate =", True), ("unet_lr", True), ("text_encoder_lr", True),
                # source lines under bitsandbytes frames (`out = bnb.matmul_4bit(...)`): trace.bnb_4bit
                ("_4bit", True),
                # config.quantized (`_4bit` above covers load_in_4bit / bnb_4bit_*)
                ("load_in_8bit", True), ("bitsandbytes", True), ("quantization_config", True), ("bnb-4bit", True),
                ("quantization_bit", True), ("qlora", True), ("q-lora", True), ("Linear4bit", True), ("Linear8bit", True),
                ("Params4bit", True), ("replace_with_bnb_linear", True), ("create_quantized_param", True))

    def feed(self, line: Any) -> bool:
        text = line.text
        low = text.lower()
        values = self.sink.values
        if "config.quantized" not in values and ("bit" in low or "bnb" in low or "quantiz" in low or "lora" in low) \
                and _QUANTIZED_RE.search(text):
            values["config.quantized"] = True  # no evidence line of its own (the differential's condition)
        if "load_in_4bit" in low and "config.load_in_4bit" not in values and _FOUR_BIT_RE.search(text):
            values["config.load_in_4bit"] = True
            self.sink._evidence("config", line)
            return True
        if "checkpoint" in low and "config.gradient_checkpointing" not in values and _CHECKPOINTING_RE.search(text):
            values["config.gradient_checkpointing"] = True
            self.sink._evidence("config", line)
            return True
        found = False
        if "batch" in low and "config.micro_batch_size" not in values:
            m = _MICRO_BATCH_RE.search(text)
            if m:
                values["config.micro_batch_size"] = _bounded_int(m.group(1), MAX_ID)
                self.sink._evidence("config", line)
                found = True
        # one command line often holds both (`--learning_rate=0.003 ... --micro_batch_size=12`)
        rates: list = []
        if "learning" in low and "config.learning_rate" not in values and not any(k in low for k in _METRIC_RECORD):
            rates += _LEARNING_RATE_RE.findall(text)[:1]
        if "_lr" in low and ("unet_lr" in low or "text_encoder_lr" in low):
            rates += _NETWORK_LR_RE.findall(text)
        for rate in rates:
            try:
                lr = float(rate)
            except ValueError:
                continue
            # the first configured rate; a network's own rate where it is higher
            if 0 < lr < 10 and lr > values.get("config.learning_rate", 0.0):
                values["config.learning_rate"] = lr
                if not found:
                    self.sink._evidence("config", line)
                found = True
        return found
