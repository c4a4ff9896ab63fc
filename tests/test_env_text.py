"""Issue 12 on the env side: readers that keep what users paste, and text a person can read.

Every snapshot fixture and pasted report is rendered in text and Markdown (in-process) and checked for
placeholder tokens, `(s)` plurals, duplicated rows and out-of-order numbers; every pasted report is
re-read after the changes a web page, a mail quote or a terminal makes to it; saved JSON with wrong
types or absurd numbers is refused with one line.
"""

import html
import io
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FIXTURES, run_cli
from loradoctor.env.checks import run_checks
from loradoctor.env.snapshot import parse_snapshot_text
from loradoctor.errors import UserError
from loradoctor.render import env_view

SNAPS = sorted((FIXTURES / "snapshots").glob("*.json"))
PASTES = sorted((FIXTURES / "env").glob("*.txt"))


def _variants():
    """(name, snapshot) for every fixture, also with a request and with no GPU, which reach other wording."""
    for path in SNAPS + PASTES:
        snap = parse_snapshot_text(path.read_text(encoding="utf-8"), name=path.name)
        yield path.stem, snap
        asked = json.loads(json.dumps(snap))
        asked["requested"] = {"features": ["bf16", "flash-attn", "bnb"], "source": "--want"}
        yield path.stem + "+want", asked
        nogpu = json.loads(json.dumps(snap))
        nogpu["nvidia"] = {"error": "could not check: NVML: NVML Shared Library Not Found; nvidia-smi not found"}
        yield path.stem + "+nogpu", nogpu


VARIANTS = list(_variants())


def render_text(snap: dict, findings) -> str:
    from rich.console import Console

    out = io.StringIO()
    env_view.print_env_report(Console(file=out, width=200, no_color=True, highlight=False), snap, findings, verbose=True)
    return out.getvalue()


PLACEHOLDER = re.compile(r"(?:^|[\s(\[:=])\?(?=$|[\s)\],.;:])|\bNone\b|\bnan\b|\{\w+\}", re.M)
_NOUNS = "process|GPU|device|error|warning|note|finding|row|line|rule|page|memory cell"
PLURAL_S = re.compile(rf"\w\(s\)|processs|(?<![\d.])\b1 (?:processes|(?:{_NOUNS})s)\b|(?<![\d.])\b(?:0|[2-9]|\d\d+) (?:{_NOUNS})\b(?!s)")
ALLOWED_NONE = re.compile(r"torch\.version\.cuda = None")


@pytest.mark.parametrize("name,snap", VARIANTS, ids=[n for n, _ in VARIANTS])
def test_rendered_text_has_no_placeholders_or_lazy_plurals(name, snap):
    findings = run_checks(snap)
    for fmt, text in (("text", render_text(snap, findings)), ("md", env_view.env_markdown(snap, findings))):
        text = ALLOWED_NONE.sub("", text)
        assert not PLACEHOLDER.findall(text), (fmt, [ln for ln in text.splitlines() if PLACEHOLDER.search(ln)])
        assert not PLURAL_S.findall(text), (fmt, [ln for ln in text.splitlines() if PLURAL_S.search(ln)])


@pytest.mark.parametrize("name,snap", VARIANTS, ids=[n for n, _ in VARIANTS])
def test_findings_are_numbered_in_the_order_shown(name, snap):
    findings = run_checks(snap)
    numbers = [int(m) for m in re.findall(r"^(\d+)\. (?:ERROR|WARNING|INFO) ", render_text(snap, findings), re.M)]
    assert numbers == list(range(1, len(findings) + 1))
    assert [f.rank for f in findings] == numbers  # JSON lists them in the same order


def test_a_broken_torch_has_one_row():
    snap = json.loads((FIXTURES / "snapshots" / "torch_segfault.json").read_text())
    text = render_text(snap, run_checks(snap))
    rows = [ln for ln in text.splitlines() if re.match(r"^  torch\s", ln)]
    assert rows == ["  torch     2.5.1+cu124: BROKEN (killed by SIGSEGV during the import)"]


def test_process_count_is_plural():
    snap = parse_snapshot_text((FIXTURES / "env" / "nvidia_smi_550_rtx4090_busy.txt").read_text())
    assert "3 processes" in render_text(snap, run_checks(snap))


@pytest.mark.parametrize("path", [p for p in PASTES if "nvidia_smi" in p.name], ids=lambda p: p.stem)
def test_an_nvidia_smi_paste_does_not_say_no_torch(path):
    # without its busy processes and errors the paste is healthy, and the verdict names what it read
    quiet = "\n".join(ln for ln in path.read_text().splitlines() if not re.search(r"\b\d{3,}\s+[CG]\s", ln))
    snap = parse_snapshot_text(quiet)
    verdict = env_view.verdict(snap, run_checks(snap))
    assert "no torch" not in verdict
    if verdict.startswith("No problems"):
        assert "torch not shown in this report" in verdict
    assert not [f for f in run_checks(snap) if f.rule in ("env.gpu_training", "env.torch_installed")]


# ---- readers strip what the web adds


def _indent(text, n=4):
    return "\n".join(" " * n + ln if ln else ln for ln in text.splitlines())


WEB_FORMS = {
    "indented-2": lambda t: _indent(t, 2),
    "indented-4": lambda t: _indent(t, 4),
    "quoted": lambda t: "\n".join("> " + ln for ln in t.splitlines()),
    "quoted-twice": lambda t: "\n".join("> > " + ln for ln in t.splitlines()),
    "html-escaped": lambda t: "<pre>\n" + html.escape(t) + "\n</pre>",
    "prompt-and-fence": lambda t: "```\nuser@gpu-box:~$ nvidia-smi\n" + t + "\n```",
    "notebook-prompt": lambda t: "In [3]: !python -m torch.utils.collect_env\n" + t,
    "lower-cased": lambda t: t.lower(),
    # an issue or forum post: prose at column 0 (one line starting with the word GPU) around the report
    # indented as a Markdown code block
    "inside-prose-indented-4": lambda t: ("GPU is not used by my training script, output below:\n\n" + _indent(t, 4)
                                          + "\n\nThanks for any hint. GPU driver was installed from the repo.\n"),
}


def _essentials(snap: dict) -> dict:
    nv = snap.get("nvidia") or {}
    t = snap.get("torch") or {}
    gpus = [(g.get("index"), str(g.get("name")).lower(), g.get("compute_capability"), g.get("memory_total_bytes"),
             [(p.get("pid"), p.get("used_bytes")) for p in g.get("processes") or []],
             g.get("ecc_uncorrected_volatile"), g.get("remapped_rows_pending")) for g in nv.get("gpus") or []]
    return {"driver": nv.get("driver_version"), "cuda": nv.get("cuda_driver_version"), "gpus": gpus,
            "nvidia_error": bool(nv.get("error")), "torch": str(t.get("version")).lower(),
            "torch_cuda": t.get("cuda_version"), "available": t.get("cuda_available"),
            "packages": {k: str(v).lower() for k, v in (snap.get("packages") or {}).items()}}


@pytest.mark.parametrize("form", sorted(WEB_FORMS))
@pytest.mark.parametrize("path", PASTES, ids=lambda p: p.stem)
def test_pastes_read_the_same_after_the_web_changed_them(path, form):
    original = path.read_text(encoding="utf-8")
    want = _essentials(parse_snapshot_text(original))
    got = parse_snapshot_text(WEB_FORMS[form](original), name=f"{path.name} ({form})")
    assert _essentials(got) == want
    assert not (got.get("meta") or {}).get("not_understood")
    findings = {(f.cause, f.severity) for f in run_checks(got)}
    assert findings == {(f.cause, f.severity) for f in run_checks(parse_snapshot_text(original))}


def test_a_table_indented_by_two_spaces_keeps_its_gpu_and_process():
    text = _indent((FIXTURES / "env" / "nvidia_smi_550_rtx4090_busy.txt").read_text(), 2)
    res = run_cli("env", "--from", "-", input=text)
    assert "no NVIDIA GPU" not in res.stdout
    assert res.stdout.splitlines()[0].startswith("1 error: Another process holds 21.90 GiB on GPU 0")


def test_rows_that_cannot_be_read_are_named_not_reported_as_absent():
    text = (FIXTURES / "env" / "nvidia_smi_550_rtx4090_busy.txt").read_text()
    mangled = re.sub(r"\|\s+0\s+NVIDIA GeForce", "| X NVIDIA GeForce", text)
    snap = parse_snapshot_text(mangled)
    assert snap["nvidia"]["error"].startswith("could not check: the GPU rows of this nvidia-smi table were not understood")
    assert snap["meta"]["not_understood"] == ["nvidia-smi: 1 of 1 GPU rows"]
    findings = run_checks(snap)
    assert not [f for f in findings if f.severity != "info"]  # unknown is not "no GPU"
    verdict = env_view.verdict(snap, findings)
    assert verdict.startswith("No problems found in what could be read") and "no NVIDIA GPU" not in verdict
    assert "not understood: nvidia-smi: 1 of 1 GPU rows" in render_text(snap, findings)
    usage = parse_snapshot_text(text.replace("MiB /  24564MiB", "MB of 24564MB"))
    assert usage["meta"]["not_understood"][0].startswith("nvidia-smi: the memory / temperature row of GPU 0")


def test_q_report_with_fewer_gpu_sections_than_attached_says_so():
    text = (FIXTURES / "env" / "nvidia_smi_q_a100_r535.txt").read_text()
    broken = re.sub(r"^GPU 0000", "Card 0000", text, flags=re.M)
    snap = parse_snapshot_text(broken)
    assert snap["nvidia"]["error"].startswith("could not check: the GPU sections of this nvidia-smi -q report")
    assert snap["meta"]["not_understood"]


# ---- saved JSON: wrong types, huge numbers, NaN / inf


def _zombie() -> dict:
    return json.loads((FIXTURES / "snapshots" / "zombie_process.json").read_text())


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d["nvidia"]["gpus"][0].update(memory_total_bytes="lots"), "nvidia.gpus[0].memory_total_bytes"),
    (lambda d: d.update(torch=[1, 2]), "snapshot field torch: expected an object"),
    (lambda d: d["nvidia"].update(gpus={"0": {}}), "nvidia.gpus: expected a list"),
    (lambda d: d["nvidia"]["gpus"][0].update(processes=["pid 1"]), "processes[0]: expected an object"),
    (lambda d: d["nvidia"]["gpus"][0].update(temperature_c=True), "temperature_c: expected a number"),
    (lambda d: d.update(packages=["torch"]), "packages"),
    (lambda d: d["system"].update(shm_bytes=1e300), "out of range"),
    (lambda d: d["torch"].update(devices=[{"index": [0]}]), "torch.devices[0].index"),
])
def test_json_with_wrong_types_is_one_line_and_exit_2(tmp_path, mutate, message):
    snap = _zombie()
    mutate(snap)
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(snap))
    res = run_cli("env", "--from", str(path))
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("literal", ["9" * 5000, "NaN", "Infinity", "-Infinity", "1e999"])
def test_json_with_absurd_numbers_is_refused(literal):
    text = json.dumps(_zombie()).replace('"memory_total_bytes": ', f'"memory_total_bytes": {literal}, "was": ', 1)
    with pytest.raises(UserError) as err:
        parse_snapshot_text(text, "snap.json")
    assert len(str(err.value)) < 200


_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30),
                    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


def _paths(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


FUZZ_BASE = [json.loads(p.read_text()) for p in SNAPS]


@settings(max_examples=int(__import__('os').environ.get('LORADOCTOR_FUZZ_EXAMPLES', '150')), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_snapshots_are_read_or_refused_never_crash(data):
    snap = json.loads(json.dumps(data.draw(st.sampled_from(FUZZ_BASE))))
    paths = list(_paths(snap))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = snap
        try:
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = data.draw(_LEAVES)
        except (KeyError, IndexError, TypeError):
            continue
    try:
        decoded = parse_snapshot_text(json.dumps(snap), "fuzz.json")
    except UserError:
        return
    findings = run_checks(decoded)
    assert not [f.title for f in findings if f.cause == "internal.check_failed"]
    render_text(decoded, findings)
    env_view.env_markdown(decoded, findings)
    json.dumps(env_view.report_document(decoded, findings, "loradoctor.env/1"))
