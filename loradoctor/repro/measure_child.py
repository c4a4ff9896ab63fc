"""The child program of `loradoctor measure`: build a model from its config with random weights on
the GPU, attach LoRA (and 4-bit base layers for QLoRA), run a few training steps, and print what the
memory really was. Runs in the user's interpreter; never downloads anything.

Input: one JSON argument (built by loradoctor.repro.measure.child_spec). Output on stdout, one JSON
object per line: progress lines (schema loradoctor.measure-progress/1) and one result line (schema
loradoctor.measure-child/1) whose status is measured | oom | skip | error.
"""

import json
import os
import sys
import threading
import time
import traceback

T0 = time.monotonic()
SPEC = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}


def say(message):
    print(json.dumps({"schema": "loradoctor.measure-progress/1", "t_s": round(time.monotonic() - T0, 1),
                      "message": message}), flush=True)


def finish(status, reason="", **data):
    torch = sys.modules.get("torch")
    versions = {"python": sys.version.split()[0], "torch": getattr(torch, "__version__", None)}
    for name in ("transformers", "peft", "bitsandbytes"):
        mod = sys.modules.get(name)
        versions[name] = getattr(mod, "__version__", None) if mod else None
    print(json.dumps({"schema": "loradoctor.measure-child/1", "status": status, "reason": reason,
                      "versions": versions, "duration_s": round(time.monotonic() - T0, 2), **data},
                     default=str), flush=True)
    os._exit(0)


class NvmlSampler(threading.Thread):
    """Samples device memory in use (NVML) every few ms: the peak nvidia-smi would have shown."""

    def __init__(self, index, interval_s=0.005):
        super().__init__(daemon=True)
        self.interval_s, self.peak_used_bytes, self.baseline_used_bytes = interval_s, None, None
        self.pid_peak_bytes = None
        self._stop_event = threading.Event()
        self.handle = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.baseline_used_bytes = pynvml.nvmlDeviceGetMemoryInfo(self.handle).used
        except Exception:
            self.handle = None

    def run(self):
        if self.handle is None:
            return
        me = os.getpid()
        while not self._stop_event.is_set():
            try:
                used = self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used
                self.peak_used_bytes = max(self.peak_used_bytes or 0, used)
                for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
                    if p.pid == me and p.usedGpuMemory:
                        self.pid_peak_bytes = max(self.pid_peak_bytes or 0, p.usedGpuMemory)
            except Exception:
                pass
            self._stop_event.wait(self.interval_s)

    def stop(self):
        self._stop_event.set()

    def reset_peak(self):
        """Forget the peak so far: the model build (QLoRA quantizes from a half-precision copy) is not a training peak."""
        self.peak_used_bytes, self.pid_peak_bytes = None, None

    def device_used_bytes(self):
        """This process's peak: NVML's per-process number, else the device's growth over the baseline."""
        if self.pid_peak_bytes:
            return self.pid_peak_bytes
        if self.peak_used_bytes is not None and self.baseline_used_bytes is not None:
            return self.peak_used_bytes - self.baseline_used_bytes
        return None


class NullSampler:
    """Stands in for NvmlSampler off the GPU."""

    handle = None

    def stop(self):
        pass

    def reset_peak(self):
        pass

    def device_used_bytes(self):
        return None


class NullMemory:
    """Stands in for torch.cuda's memory counters off the GPU (the CPU test path): zeros."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: 0


def physical_index(torch):
    """NVML index of torch's cuda:0 (CUDA_VISIBLE_DEVICES renumbers); 0 when unknown."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


def make_optimizer(name, params, torch):
    lr = 1e-4
    if name in ("adamw_torch", "adamw_hf"):
        return torch.optim.AdamW(params, lr=lr)
    if name == "adamw_torch_fused":
        return torch.optim.AdamW(params, lr=lr, fused=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adafactor":
        from transformers.optimization import Adafactor
        return Adafactor(params, lr=lr, relative_step=False, scale_parameter=False)
    import bitsandbytes as bnb
    table = {"adamw_8bit": bnb.optim.AdamW8bit, "paged_adamw_8bit": bnb.optim.PagedAdamW8bit,
             "paged_adamw_32bit": bnb.optim.PagedAdamW32bit, "adamw_bnb_32bit": bnb.optim.AdamW32bit,
             "lion_8bit": bnb.optim.Lion8bit, "paged_lion_8bit": bnb.optim.PagedLion8bit}
    return table[name](params, lr=lr)


def quantize_linears(model, torch, spec, dtype):
    """Swap every Linear inside the decoder layers for a bitsandbytes 4-bit / 8-bit one, quantizing the
    random weights on the GPU one layer at a time (what from_pretrained(quantization_config=...) produces)."""
    import bitsandbytes as bnb

    quant = spec["quant"]
    swapped = 0
    for parent_name, parent in list(model.named_modules()):
        if ".layers." not in f".{parent_name}." and not parent_name.endswith("layers"):
            continue
        for child_name, child in list(parent.named_children()):
            if not isinstance(child, torch.nn.Linear) or child_name == "lm_head":
                continue
            has_bias = child.bias is not None
            weight = child.weight.data
            if quant in ("nf4", "fp4"):
                new = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=has_bias, compute_dtype=dtype,
                                        compress_statistics=bool(spec.get("double_quant")), quant_type=quant)
                new.weight = bnb.nn.Params4bit(weight.to(torch.float16 if dtype == torch.float32 else dtype),
                                               requires_grad=False, compress_statistics=bool(spec.get("double_quant")),
                                               quant_type=quant)
            else:
                new = bnb.nn.Linear8bitLt(child.in_features, child.out_features, bias=has_bias, has_fp16_weights=False,
                                          threshold=6.0)
                new.weight = bnb.nn.Int8Params(weight.to(torch.float16), requires_grad=False, has_fp16_weights=False)
            if has_bias:
                new.bias = torch.nn.Parameter(child.bias.data.to(dtype), requires_grad=False)
            setattr(parent, child_name, new.to("cuda"))  # .to(cuda) quantizes
            del child, weight
            swapped += 1
    torch.cuda.empty_cache()
    try:
        model.is_loaded_in_4bit = quant in ("nf4", "fp4")  # PEFT dispatches its bnb LoRA layers on this
        model.is_loaded_in_8bit = quant == "8bit"
    except Exception:
        pass
    return swapped


def build(torch, spec, device):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(spec["config"])
    model_type = cfg.pop("model_type")
    for key in ("quantization_config", "auto_map", "torch_dtype", "dtype", "architectures", "_name_or_path"):
        cfg.pop(key, None)
    cfg["use_cache"] = False
    cfg["max_position_embeddings"] = max(int(cfg.get("max_position_embeddings") or 0), int(spec["seq_len"]))
    config = AutoConfig.for_model(model_type, **cfg)
    precision = spec["precision"]
    half = torch.float16 if precision.startswith("fp16") else torch.bfloat16
    dtype = torch.float32 if (precision == "fp32" or spec["method"] == "full" and "true" not in precision) else half
    attn = spec["attn"]
    say(f"building {model_type} ({config.num_hidden_layers} layers, hidden {config.hidden_size}) "
        f"with random weights in {str(dtype).replace('torch.', '')} on {device.type}, attention {attn}")
    kwargs = {"attn_implementation": attn}
    with device:  # random init straight on the GPU: seconds, not minutes, for an 8B model
        try:
            model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype, **kwargs)
        except TypeError:  # newest transformers renamed torch_dtype to dtype
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, **kwargs)
    compute_dtype = half if precision != "fp32" else torch.float32
    if spec["quant"] != "none":
        say(f"quantizing the decoder's linear layers to {spec['quant']} (bitsandbytes)")
        quantize_linears(model, torch, spec, compute_dtype)
    return model, dtype, compute_dtype


def main():
    on_cuda = SPEC.get("device", "cuda") == "cuda"  # "cpu" exercises the same code path in tests (no memory numbers)
    nodes = ("/dev/nvidiactl", "/proc/driver/nvidia/version", "/dev/dxg", "/dev/kfd")  # NVIDIA, WSL2, ROCm
    if on_cuda and sys.platform.startswith("linux") and not any(os.path.exists(p) for p in nodes):
        finish("skip", "this machine has no GPU driver (no /dev/nvidiactl, /proc/driver/nvidia, /dev/dxg)")
    try:
        import torch
    except ModuleNotFoundError:
        finish("skip", f"torch is not installed for {sys.executable}")
    if on_cuda and (torch.version.cuda is None or not torch.cuda.is_available()):
        finish("skip", f"no CUDA GPU visible to torch {torch.__version__}")
    missing = []
    for name in ("transformers", "peft") + (("bitsandbytes",) if SPEC["quant"] != "none" or "8bit" in SPEC["optim"]
                                            or SPEC["optim"].startswith("paged") or SPEC["optim"] == "adamw_bnb_32bit" else ()):
        try:
            __import__(name)
        except ModuleNotFoundError:
            missing.append(name)
    if SPEC["method"] == "full":
        missing = [m for m in missing if m != "peft"]
    if missing:
        finish("skip", f"{', '.join(missing)} not installed for {sys.executable}")
    if SPEC["attn"] == "flash_attention_2":
        try:
            import flash_attn  # noqa: F401
        except Exception as exc:
            finish("skip", f"attn flash_attention_2 asked for but flash_attn cannot be imported: {exc}")
    if on_cuda:
        sampler = NvmlSampler(physical_index(torch))
        sampler.start()
        device = torch.device("cuda", 0)
        gpu = {"name": torch.cuda.get_device_name(0), "total_bytes": torch.cuda.get_device_properties(0).total_memory}
        mem = torch.cuda
    else:
        sampler, device, gpu, mem = NullSampler(), torch.device("cpu"), None, NullMemory()
    step_rows = []
    phase = "build"
    try:
        model, dtype, compute_dtype = build(torch, SPEC, device)
        phase = "adapters"
        if SPEC["method"] != "full":
            from peft import LoraConfig, get_peft_model

            for p in model.parameters():
                p.requires_grad_(False)
            if SPEC["quant"] != "none":
                # what peft's prepare_model_for_kbit_training does: non-quantized params to fp32
                for p in model.parameters():
                    if p.dtype in (torch.float16, torch.bfloat16) and p.__class__.__name__ not in ("Params4bit", "Int8Params"):
                        p.data = p.data.float()
            lora = LoraConfig(r=SPEC["rank"], lora_alpha=SPEC["alpha"], lora_dropout=SPEC["dropout"],
                              target_modules=list(SPEC["targets"]), modules_to_save=list(SPEC["modules_to_save"]) or None,
                              task_type="CAUSAL_LM")
            # PEFT upcasts adapters to fp32 (autocast_adapter_dtype); pure-half runs keep them in half
            model = get_peft_model(model, lora, autocast_adapter_dtype=not SPEC["precision"].endswith("-true"))
        if SPEC["gradient_checkpointing"]:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if hasattr(model, "enable_input_require_grads"):
                model.enable_input_require_grads()
        model.train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        n_trainable = sum(p.numel() for p in trainable)
        n_total = sum(p.numel() for p in model.parameters())
        optimizer = make_optimizer(SPEC["optim"], trainable, torch)
        gen = torch.Generator(device="cpu").manual_seed(0)
        vocab = model.config.vocab_size if hasattr(model, "config") else SPEC["config"]["vocab_size"]
        ids = torch.randint(0, vocab, (SPEC["batch"], SPEC["seq_len"]), generator=gen).to(device)
        mem.synchronize()
        mem.empty_cache()
        mem.reset_peak_memory_stats()
        sampler.reset_peak()
        before_alloc = mem.memory_allocated()
        say(f"model ready: {n_trainable:,} trainable of {n_total:,} parameters, "
            f"{before_alloc / 2**30:.2f} GiB allocated; training {SPEC['steps']} steps of {SPEC['batch']} x {SPEC['seq_len']}")
        autocast = SPEC["precision"] in ("bf16", "fp16")
        phase = "train"
        for step in range(1, SPEC["steps"] + 1):
            t0 = time.monotonic()
            with torch.autocast(device.type, dtype=compute_dtype, enabled=autocast):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            mem.synchronize()
            row = {"step": step, "s": round(time.monotonic() - t0, 3), "loss": float(loss.item()),
                   "peak_allocated_bytes": mem.max_memory_allocated(),
                   "peak_reserved_bytes": mem.max_memory_reserved()}
            step_rows.append(row)
            say(f"step {step}/{SPEC['steps']}: {row['s']:.2f} s, loss {row['loss']:.3f}, peak allocated "
                f"{row['peak_allocated_bytes'] / 2**30:.2f} GiB, reserved {row['peak_reserved_bytes'] / 2**30:.2f} GiB")
            del loss
    except torch.cuda.OutOfMemoryError as exc:  # an alias of torch.OutOfMemoryError on torch >= 2.5
        time.sleep(0.05)
        sampler.stop()
        finish("oom", f"CUDA out of memory during {phase}" + (f" (step {len(step_rows) + 1})" if phase == "train" else ""),
               gpu=gpu, steps=step_rows, message=str(exc).splitlines()[0][:400],
               peak_allocated_bytes=mem.max_memory_allocated(),
               peak_reserved_bytes=mem.max_memory_reserved(), device_used_bytes=sampler.device_used_bytes())
    except Exception as exc:
        sampler.stop()
        finish("error", f"{phase} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
               gpu=gpu, steps=step_rows, traceback=traceback.format_exc().splitlines()[-8:])
    time.sleep(0.05)  # one more NVML sample after the last step
    sampler.stop()
    finish("measured", gpu=gpu, steps=step_rows, trainable_params=n_trainable, total_params=n_total,
           peak_allocated_bytes=max(r["peak_allocated_bytes"] for r in step_rows),
           peak_reserved_bytes=max(r["peak_reserved_bytes"] for r in step_rows),
           device_used_bytes=sampler.device_used_bytes(), nvml=sampler.handle is not None)


if __name__ == "__main__":
    main()
