"""The card table's features and names: a run is judged on bf16 / FlashAttention 2 / fp8 as well as memory,
and a name that is several cards asks which (issue 12)."""

from loradoctor.record import replace

import pytest

from loradoctor.errors import UserError
from loradoctor.estimate.arch import resolve_arch
from loradoctor.estimate.cards import FEATURE_MIN_CC, supports, unsupported, variants
from loradoctor.estimate.fit import Gpu, find_gpu, gpu_by_name, gpu_table
from loradoctor.estimate.memory import EstimateInputs

from conftest import run_cli

QWEN = resolve_arch("Qwen/Qwen2.5-0.5B")


def test_every_card_states_its_features_consistently_with_its_compute_capability():
    for card, spec in gpu_table().items():
        cc = tuple(int(x) for x in str(spec["cc"]).split("."))
        for feature, floor in FEATURE_MIN_CC.items():
            assert isinstance(spec.get(feature), bool), (card, feature)
            assert spec[feature] == (cc >= floor), (card, feature)


@pytest.mark.parametrize("name, cards", [
    ("A100", {"A100 40GB", "A100 80GB"}),
    ("NVIDIA A100", {"A100 40GB", "A100 80GB"}),
    ("v100", {"V100 16GB", "V100 32GB"}),
    ("A6000", {"RTX A6000", "RTX 6000 Ada"}),
    ("4060 Ti", {"RTX 4060 Ti 8GB", "RTX 4060 Ti 16GB"}),
])
def test_ambiguous_names_ask_for_the_variant(name, cards):
    assert set(variants(name)) == cards
    assert find_gpu(name) is None
    with pytest.raises(UserError) as exc:
        gpu_by_name(name)
    assert all(c in str(exc.value) for c in cards)


@pytest.mark.parametrize("name, card", [
    ("A100 80GB", "A100 80GB"), ("a100-40gb", "A100 40GB"), ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("Tesla V100-SXM2-32GB", "V100 32GB"), ("NVIDIA RTX A6000", "RTX A6000"), ("RTX 6000 Ada Generation", "RTX 6000 Ada"),
    ("H100", "H100 80GB"), ("T4", "T4"), ("NVIDIA GeForce RTX 4060 Ti 16GB", "RTX 4060 Ti 16GB"),
])
def test_full_names_are_not_ambiguous(name, card):
    assert variants(name) == [] or find_gpu(name) == card
    assert gpu_by_name(name).name == card


def test_t4_has_neither_bf16_nor_flash_attention_and_says_what_instead():
    t4 = gpu_by_name("T4")
    inp = EstimateInputs(arch=QWEN, precision="bf16", attn="flash_attention_2")
    problems = {u.feature: u for u in unsupported(inp, t4)}
    assert set(problems) == {"bf16", "flash_attn2"}
    assert problems["bf16"].option == "--precision fp16" and "7.5" in problems["bf16"].text
    assert problems["flash_attn2"].option == "--attn sdpa"
    assert unsupported(replace(inp, precision="fp16", attn="sdpa"), t4) == []
    assert [u.option for u in unsupported(replace(inp, precision="bf16-true", attn="sdpa"), t4)] == ["--precision fp16-true"]
    assert unsupported(inp, gpu_by_name("RTX 4090")) == []


def test_fp8_needs_ada_or_hopper():
    class Fp8Run:  # the memory model has no fp8 mode yet; the card check reads the precision's name
        precision, attn = "fp8", "sdpa"

    (problem,) = unsupported(Fp8Run(), gpu_by_name("A100 80GB"))
    assert problem.feature == "fp8" and problem.option == "--precision bf16"
    assert unsupported(Fp8Run(), gpu_by_name("H100")) == []
    assert unsupported(Fp8Run(), gpu_by_name("RTX 4090")) == []


def test_features_of_a_card_known_only_by_capability_or_size():
    local = Gpu(name="NVIDIA Tesla T4 (free now)", memory_bytes=15 << 30, source="local free memory",
                compute_capability="7.5")
    assert supports(local, "bf16") is False and supports(local, "flash_attn2") is False
    sized = Gpu(name="24GB card", memory_bytes=24 << 30, source="vram")
    assert supports(sized, "bf16") is None
    assert unsupported(EstimateInputs(arch=QWEN, attn="flash_attention_2"), sized) == []


def test_estimate_cli_says_a_t4_cannot_run_bf16_flash_attention():
    out = run_cli("estimate", "--model", "Qwen/Qwen2.5-0.5B", "--seq-len", "512", "--gpu", "T4",
                  "--precision", "bf16", "--attn", "flash_attention_2", "--no-what-if")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "CANNOT RUN AS CONFIGURED on T4" in out.stdout and "FITS" not in out.stdout
    assert "--precision fp16 --attn sdpa" in out.stdout


def test_estimate_cli_ambiguous_card_and_vram_without_unit_exit_2():
    out = run_cli("estimate", "--model", "Qwen/Qwen2.5-0.5B", "--gpu", "A100")
    assert out.returncode == 2 and "A100 40GB" in out.stderr and "A100 80GB" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = run_cli("estimate", "--model", "Qwen/Qwen2.5-0.5B", "--vram", "24")
    assert out.returncode == 2 and "24GB or 24GiB" in out.stderr
    help_text = run_cli("estimate", "--help").stdout
    assert "24GB and 24GiB both mean" in " ".join(help_text.split())


def test_local_gpu_index_must_exist(monkeypatch):
    from loradoctor.env.probes import nvidia
    from loradoctor.estimate.inputs import gpu_budget

    section = {"gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9",
                         "memory_total_bytes": 25_757_220_864, "memory_free_bytes": 20 * 2**30}]}
    monkeypatch.setattr(nvidia, "probe", lambda timeout_s: section)
    assert gpu_budget("local:0", None).memory_bytes == 20 * 2**30
    for spec, words in (("local:-1", "0 or more"), ("local:3", "this machine has GPU 0"), ("local:x", "0 or more")):
        with pytest.raises(UserError, match=words):
            gpu_budget(spec, None)


def test_vram_verdict_says_features_were_not_checked():
    out = run_cli("estimate", "--model", "Qwen/Qwen2.5-0.5B", "--seq-len", "512", "--vram", "16GB", "--no-what-if")
    assert out.returncode == 0 and "FITS on 16GB card (16.00 GiB, vram)" in out.stdout
    assert "was not checked" in " ".join(out.stdout.split())
