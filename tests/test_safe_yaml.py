"""The safe config reader: alias bombs, size, encodings, binary, depth; one line naming the file."""

import codecs
import time

import pytest
from hypothesis import given, settings, strategies as st

from loradoctor.errors import UserError
from loradoctor.safe_yaml import MAX_CONFIG_BYTES, load_config_file, load_json, load_yaml, read_text


def _laughs(levels: int = 9, width: int = 9) -> str:
    """The classic alias bomb: width**levels strings from a few hundred bytes."""
    lines = ["a0: &a0 [" + ",".join(['"lol"'] * width) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    lines += ["base_model: meta-llama/Llama-3.1-8B", f"lora_target_modules: *a{levels}"]
    return "\n".join(lines) + "\n"


def _refused(path, *words):
    with pytest.raises(UserError) as exc:
        load_config_file(path)
    message = str(exc.value)
    assert "\n" not in message and str(path) in message and len(message) < 400
    for word in words:
        assert word in message
    return message


def test_alias_bomb_is_refused_quickly(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_laughs())
    assert path.stat().st_size < 700
    start = time.monotonic()
    _refused(path, "alias")
    assert time.monotonic() - start < 2.0


def test_a_few_aliases_are_fine(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("defaults: &d {lora_r: 16, lora_alpha: 32}\nbase_model: x\nrun: *d\nmodules: &m [q_proj, v_proj]\nlora_target_modules: *m\n")
    data = load_yaml(path)
    assert data["run"] == {"lora_r": 16, "lora_alpha": 32} and data["lora_target_modules"] == ["q_proj", "v_proj"]


def test_recursive_alias_and_deep_nesting_are_refused(tmp_path):
    rec = tmp_path / "rec.yaml"
    rec.write_text("a: &x [1, *x]\n")
    _refused(rec, "refers to itself")
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    _refused(deep)
    deep_json = tmp_path / "deep.json"
    deep_json.write_text("[" * 100_000 + "]" * 100_000)
    _refused(deep_json)


def test_size_limit(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("base_model: x\n" + "# padding\n" * (MAX_CONFIG_BYTES // 10 + 10))
    _refused(path, "too large")


@pytest.mark.parametrize("bom, encoding", [
    (b"", "utf-8"), (codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"),
])
def test_utf8_and_utf16_with_bom_are_read(tmp_path, bom, encoding):
    text = "base_model: meta-llama/Llama-3.1-8B  # é\nmicro_batch_size: 2\n"
    path = tmp_path / "c.yaml"
    path.write_bytes(bom + text.encode(encoding))
    assert load_yaml(path) == {"base_model": "meta-llama/Llama-3.1-8B", "micro_batch_size": 2}
    jpath = tmp_path / "c.json"
    jpath.write_bytes(bom + '{"per_device_train_batch_size": 2}'.encode(encoding))
    assert load_json(jpath) == {"per_device_train_batch_size": 2}


def test_binary_latin1_and_bomless_utf16_are_refused(tmp_path):
    binary = tmp_path / "model.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    _refused(binary, "not a text file")
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("base_model: caf\xe9\n".encode("latin-1"))
    _refused(latin1, "UTF-8", "0xe9")
    utf16 = tmp_path / "nobom.yaml"
    utf16.write_bytes("base_model: x\n".encode("utf-16-le"))
    _refused(utf16, "NUL")


def test_not_a_regular_file_and_missing(tmp_path):
    _refused(tmp_path, "not a regular file")
    _refused(tmp_path / "missing.yaml", "cannot read")


def test_huge_integer_and_bad_syntax_are_one_short_line(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("micro_batch_size: " + "9" * 5000 + "\n")
    assert "4,300 digits" in _refused(big)
    bigj = tmp_path / "big.json"
    bigj.write_text('{"per_device_train_batch_size": ' + "9" * 5000 + "}")
    assert "4,300 digits" in _refused(bigj)
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1, 2\nb: " + "x" * 100_000 + "\n")
    _refused(broken, "not valid YAML")


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_give_data_or_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "c.yaml"
    path.write_bytes(data)
    try:
        load_yaml(path)
    except UserError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400


def test_read_text_strips_the_bom(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(codecs.BOM_UTF8 + b"a: 1\n")
    assert read_text(path) == "a: 1\n"


def test_a_model_config_json_goes_through_the_same_reader(tmp_path):
    from loradoctor.estimate.arch import resolve_arch

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_bytes(b"\x87\x00binary" * 50)
    with pytest.raises(UserError, match="not a text file"):
        resolve_arch(str(folder))
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match="nested too deeply"):
        resolve_arch(str(folder))
