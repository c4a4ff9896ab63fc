"""Fuzz: the `env --from` importers (saved JSON, collect_env text, nvidia-smi tables and -q text) and
the env checks and renderers behind them; the training-config readers of estimate/preflight
(loradoctor.estimate.configs). Any input gives a result or a UserError, never another exception,
in bounded time."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from conftest import FIXTURES
from fuzz_support import FUZZ, HOSTILE, bounded
from loradoctor.errors import UserError

PASTES = sorted((FIXTURES / "env").glob("*.txt"))
SNAPSHOTS = sorted((FIXTURES / "snapshots").glob("*.json"))
CONFIGS = sorted(p for p in (FIXTURES / "configs").rglob("*") if p.suffix in (".yaml", ".yml", ".json"))

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10 ** 30), 10 ** 30),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
                         st.sampled_from(HOSTILE))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                  st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                           max_leaves=12)


def _mutated_lines(text: str, ops: list) -> str:
    lines = text.splitlines()
    for kind, where, token in ops:
        if not lines:
            break
        i = where % len(lines)
        if kind == "drop":
            del lines[i]
        elif kind == "dup":
            lines.insert(i, lines[i])
        elif kind == "indent":
            lines[i] = token[:8].replace("\n", " ") + lines[i]
        else:
            cut = where % (len(lines[i]) + 1)
            lines[i] = lines[i][:cut] + token + lines[i][cut:]
    return "\n".join(lines)


mutations = st.lists(st.tuples(st.sampled_from(["drop", "dup", "indent", "insert"]), st.integers(0, 10 ** 6),
                               st.one_of(st.sampled_from(HOSTILE), st.text(max_size=20))), max_size=8)


def _env_from(path: Path) -> None:
    from loradoctor.env import checks
    from loradoctor.env.snapshot import load_snapshot
    from loradoctor.render import env_view

    with bounded():
        try:
            snapshot = load_snapshot(str(path))
        except UserError:
            return
        findings = checks.run_checks(snapshot)
        env_view.env_markdown(snapshot, findings)


@FUZZ
@given(base=st.sampled_from(PASTES), ops=mutations)
def test_env_from_mutated_pastes(tmp_path_factory, base, ops):
    path = tmp_path_factory.mktemp("paste") / "paste.txt"
    path.write_text(_mutated_lines(base.read_text(encoding="utf-8"), ops), encoding="utf-8", errors="surrogatepass")
    _env_from(path)


@FUZZ
@given(base=st.sampled_from(SNAPSHOTS), section=st.sampled_from(["system", "nvidia", "torch", "packages", "env_vars",
                                                                   "bitsandbytes", "flash_attn", "meta"]),
       key=st.text(max_size=12), value=json_values)
def test_env_from_snapshot_json_with_wrong_types(tmp_path_factory, base, section, key, value):
    doc = json.loads(base.read_text(encoding="utf-8"))
    snap = doc.get("snapshot", doc)
    target = snap.get(section)
    if isinstance(target, dict) and target:
        target[key if key else sorted(target)[0]] = value
    else:
        snap[section] = value
    path = tmp_path_factory.mktemp("snap") / "snap.json"
    path.write_text(json.dumps(doc, allow_nan=True), encoding="utf-8")
    _env_from(path)


@FUZZ
@given(text=st.text(max_size=2000))
def test_env_from_random_text(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("paste") / "paste.txt"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _env_from(path)


@FUZZ
@given(base=st.sampled_from(CONFIGS) if CONFIGS else st.nothing(), ops=mutations)
def test_config_readers_on_mutated_configs(tmp_path_factory, base, ops):
    from loradoctor.estimate import configs

    path = tmp_path_factory.mktemp("cfg") / base.name
    path.write_text(_mutated_lines(base.read_text(encoding="utf-8"), ops), encoding="utf-8", errors="surrogatepass")
    with bounded():
        try:
            configs.read_configs([path])
        except UserError:
            pass


@FUZZ
@given(reader=st.sampled_from(["read_axolotl", "read_llamafactory", "read_training_args", "read_adapter_config"]),
       data=st.dictionaries(st.sampled_from(["base_model", "micro_batch_size", "sequence_len", "adapter", "lora_r",
                                             "lora_alpha", "load_in_4bit", "bf16", "fp16", "gradient_checkpointing",
                                             "per_device_train_batch_size", "cutoff_len", "quantization_bit", "r",
                                             "target_modules", "peft_type", "finetuning_type", "lora_rank",
                                             "lora_target", "optim", "max_seq_length", "model_name_or_path"]),
                            json_values, max_size=8),
       suffix=st.sampled_from([".yaml", ".json"]))
def test_config_files_with_wrong_types(tmp_path_factory, reader, data, suffix):
    from loradoctor.estimate import configs

    path = tmp_path_factory.mktemp("cfg") / f"train{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(data, allow_nan=True), encoding="utf-8")
    else:
        import yaml

        path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    with bounded():
        try:
            configs.read_config(path)
        except UserError:
            pass


def test_a_blank_run_inside_an_nvidia_smi_row_is_read_in_bounded_time(tmp_path):
    """Found by benchmarks/fuzz_campaign.py (seed 11): 3,000 tabs after a GPU row's bus id made the row
    regexes backtrack for 13 s. A line far longer than any table row is left out, by `env --from` and by
    the log extractor that reads a pasted table with the same importer."""
    from loradoctor.env.snapshot import load_snapshot
    from loradoctor.logs import engine

    table = (FIXTURES / "env" / "nvidia_smi_580_h100x2.txt").read_text(encoding="utf-8")
    row = next(line for line in table.splitlines() if line.startswith("|   1 "))
    hostile = table.replace(row, row.replace("00000000:", "00000000:" + "\t" * 3000, 1))
    paste = tmp_path / "nvidia-smi.txt"
    paste.write_text(hostile, encoding="utf-8")
    with bounded(2.0):  # milliseconds when the row is left out; 13 s when the row regexes backtracked over it
        gpus = load_snapshot(str(paste))["nvidia"]["gpus"]
    assert [g["index"] for g in gpus] == [0]  # the mangled row is no row
    log = tmp_path / "oom-then-smi.log"
    log.write_text("RuntimeError: CUDA error: out of memory\n" + hostile.replace("\t" * 3000, "\t" * 8000),
                   encoding="utf-8")
    with bounded():
        engine.explain([str(log)])
