"""DoctorCallback and loradoctor.watch() with CPU torch and a tiny random transformers + peft model.
Skipped where torch / transformers / peft are not installed (CI installs pinned CPU versions)."""

import json
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from loradoctor.bedside.timeline import read_timeline  # noqa: E402


def _tiny_model():
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    return model


class _Data(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        ids = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}


def _trainer(model, out, callback, max_steps=4):
    args = transformers.TrainingArguments(output_dir=str(out / "hf"), max_steps=max_steps, per_device_train_batch_size=2,
                                          logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                                          learning_rate=1e-3, disable_tqdm=True)
    return transformers.Trainer(model=model, args=args, train_dataset=_Data(), callbacks=[callback])


def test_callback_writes_preflight_and_steps(tmp_path):
    from loradoctor.integrations.transformers import DoctorCallback

    model = peft.get_peft_model(_tiny_model(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    cb = DoctorCallback(out=str(tmp_path / "doc"), seq_len=16)
    _trainer(model, tmp_path, cb).train()
    tl = read_timeline(tmp_path / "doc")
    pre = tl.preflight[-1]
    assert 0 < pre["trainable_params"] < pre["total_params"]
    assert pre["trainable_dtypes"] == {"float32": pre["trainable_params"]}
    assert pre["quantization"] is None and pre["warnings"] == []
    assert pre["estimate_bytes"] > 0 and pre["estimate_seq_len"] == 16
    assert [r["step"] for r in tl.steps if "loss" in r] == [1, 2, 3, 4]
    assert all(r["loss"] > 0 for r in tl.steps if "loss" in r)
    assert tl.end["exit_code"] == 0
    assert sys.excepthook is not cb._hook  # restored


def test_callback_warns_when_nothing_is_trainable(tmp_path, capsys):
    from loradoctor.integrations.transformers import DoctorCallback

    model = _tiny_model()
    for p in model.parameters():
        p.requires_grad_(False)
    cb = DoctorCallback(out=str(tmp_path / "doc"))
    from loradoctor.integrations.transformers import inspect_model

    facts = inspect_model(model)
    assert facts["trainable_params"] == 0
    assert any("no parameter is trainable" in w for w in facts["warnings"])
    from loradoctor.bedside.diagnose import timeline_findings

    cb.bedside = None
    from loradoctor.integrations.watch import Bedside

    b = Bedside(out=str(tmp_path / "doc"))
    b.preflight(facts)
    b.close()
    causes = [f.cause for f in timeline_findings(read_timeline(tmp_path / "doc"))]
    assert "loss.flat" in causes
    assert "no parameter is trainable" in capsys.readouterr().err


def test_callback_exception_path_writes_report(tmp_path):
    from loradoctor.integrations.transformers import DoctorCallback

    model = peft.get_peft_model(_tiny_model(), peft.LoraConfig(r=4, target_modules=["q_proj"]))
    cb = DoctorCallback(out=str(tmp_path / "doc"))

    class Boom(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")

    trainer = _trainer(model, tmp_path, cb)
    trainer.add_callback(Boom())
    with pytest.raises(RuntimeError) as info:
        trainer.train()
    where = cb.handle_exception(info.value)
    report = (tmp_path / "doc" / "report.md").read_text()
    assert where and "cuda.illegal_access" in report
    tl = read_timeline(tmp_path / "doc")
    assert any(e.get("name") == "exception" for e in tl.events) and tl.end["exit_code"] == 1
    cb.on_train_end(None, None, None)


def test_watch_context_manager_records_and_reraises(tmp_path):
    import loradoctor

    with pytest.raises(ValueError):
        with loradoctor.watch(out=str(tmp_path / "w")) as doc:
            for i in range(3):
                doc.step(step=i, loss=torch.tensor(1.0 / (i + 1)))
            raise ValueError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!")
    tl = read_timeline(tmp_path / "w")
    assert [round(r["loss"], 3) for r in tl.steps] == [1.0, 0.5, 0.333]
    assert "train.device_mismatch" in (tmp_path / "w" / "report.md").read_text()


def test_importing_loradoctor_does_not_import_torch_or_transformers():
    import subprocess

    code = "import loradoctor, loradoctor.bedside.runner, loradoctor.bedside.diagnose, sys; " \
           "print(json.dumps(sorted(m for m in ('torch','transformers','peft') if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
