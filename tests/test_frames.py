"""Traceback dialects -> one frame list -> the phase (facts/frames.py, loradoctor/data/frames.yaml):
every dialect x every phase, the parser's frames one by one, the table's keys, and bitsandbytes'
4-bit frames (trace.bnb_4bit)."""

import re
import tempfile
from pathlib import Path

import pytest

from loradoctor.logs.facts import FactCollector
from loradoctor.logs.facts.frames import Frame, frame_key, frame_table, location_from_frames, parse_frames
from loradoctor.logs.reader import make_line

SITE = "/usr/local/lib/python3.10/dist-packages/"
WIN_SITE = "C:\\Users\\Jane Doe\\AppData\\Local\\Programs\\Python\\Python310\\lib\\site-packages\\"
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.02 GiB. GPU 0 has a total capacity of "
       "79.25 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.18 GiB memory in "
       "use. Of the allocated memory 76.20 GiB is allocated by PyTorch, and 200.00 MiB is reserved by PyTorch "
       "but unallocated.")

# phase -> frames (file under site-packages, class for qualified names or None, function), outermost first
_TRAIN = [("transformers/trainer.py", "Trainer", "train"), ("transformers/trainer.py", "Trainer", "_inner_training_loop")]
_MODULE = [("torch/nn/modules/module.py", "Module", "_wrapped_call_impl"), ("torch/nn/modules/module.py", "Module", "_call_impl"),
           ("transformers/models/llama/modeling_llama.py", "LlamaForCausalLM", "forward")]
PHASES = {
    "load": [("transformers/models/auto/auto_factory.py", "_BaseAutoModelClass", "from_pretrained"),
             ("transformers/modeling_utils.py", "PreTrainedModel", "from_pretrained"),
             ("transformers/modeling_utils.py", "PreTrainedModel", "_load_pretrained_model"),
             ("transformers/modeling_utils.py", None, "_load_state_dict_into_meta_model"),
             ("accelerate/utils/modeling.py", None, "set_module_tensor_to_device")],
    "forward": _TRAIN + [("transformers/trainer.py", "Trainer", "training_step"),
                         ("transformers/trainer.py", "Trainer", "compute_loss")] + _MODULE,
    "backward": _TRAIN + [("transformers/trainer.py", "Trainer", "training_step"),
                          ("accelerate/accelerator.py", "Accelerator", "backward"), ("torch/_tensor.py", "Tensor", "backward"),
                          ("torch/autograd/graph.py", None, "_engine_run_backward")],
    "optimizer": _TRAIN + [("accelerate/optimizer.py", "AcceleratedOptimizer", "step"),
                           ("torch/optim/adamw.py", "AdamW", "step")],
    "eval": _TRAIN + [("transformers/trainer.py", "Trainer", "_maybe_log_save_evaluate"),
                      ("transformers/trainer.py", "Trainer", "evaluate"),
                      ("transformers/trainer.py", "Trainer", "evaluation_loop")] + _MODULE,
    # Trainer.predict runs the evaluation loop: the eval phase
    "predict": [("transformers/trainer.py", "Trainer", "predict"), ("transformers/trainer.py", "Trainer", "evaluation_loop"),
                ("transformers/trainer.py", "Trainer", "prediction_step")] + _MODULE,
    "generate": [("transformers/generation/utils.py", "GenerationMixin", "generate"),
                 ("transformers/generation/utils.py", "GenerationMixin", "_sample")] + _MODULE,
    "save": _TRAIN + [("transformers/trainer.py", "Trainer", "_save_checkpoint"), ("transformers/trainer.py", "Trainer", "save_model"),
                      ("peft/peft_model.py", "PeftModel", "save_pretrained"), ("torch/serialization.py", None, "save")],
    "merge": [("peft/tuners/lora/model.py", "LoraModel", "merge_and_unload"),
              ("peft/tuners/tuners_utils.py", "BaseTuner", "_unload_and_optionally_merge"),
              ("peft/tuners/lora/bnb.py", "Linear4bit", "merge")],
}
EXPECTED = {"predict": "eval"}


def _cpython(frames, site=SITE, sep="/"):
    out = ["Traceback (most recent call last):", '  File "/content/train.py", line 80, in <module>', "    main()"]
    for n, (path, _, fn) in enumerate(frames, 100):
        out += [f'  File "{site}{path.replace("/", sep)}", line {n}, in {fn}', "    out = self.step(x)"]
    return out + [OOM]


def cpython(frames):
    return _cpython(frames)


def windows(frames):
    return _cpython(frames, WIN_SITE, "\\")


def rank(frames):  # torchrun / accelerate / Lightning workers
    return ["[rank0]: " + line for line in _cpython(frames)]


def lower(frames):  # pasted from an issue title or a chat that lower-cased it
    return [line.lower() for line in _cpython(frames)]


def markdown(frames):
    """Rendered markdown: typographic quotes, `<module>` eaten as a tag, `__init__` as bold `init`,
    underscores lost to italics, and the paragraph joined into one line."""
    text = " ".join(_cpython(frames)[:-1])
    text = re.sub(r'"([^"]*)"', "“\\1”", text).replace("<module>", "")
    text = re.sub(r"\b_+(\w+?)_*\b", lambda m: m.group(1).replace("_", ""), text)
    return [text, OOM]


def ipython(frames):  # IPython 8 / Jupyter / Colab
    out = ["-" * 75, "OutOfMemoryError                          Traceback (most recent call last)",
           "Cell In[7], line 3", "      1 trainer = Trainer(model=model)", "----> 3 trainer.train()", ""]
    for n, (path, cls, fn) in enumerate(frames, 100):
        qual = f"{cls}.{fn}" if cls else fn
        out += [f"File {SITE}{path}:{n}, in {qual}(self, *args, **kwargs)", f"    {n - 1} x = 1", f"--> {n} out = self.step(x)", ""]
    return out + [OOM]


def ipython_old(frames):  # IPython 7 (older Colab)
    out = ["-" * 75, "OutOfMemoryError                          Traceback (most recent call last)",
           "<ipython-input-7-3f2a1b> in <module>()", "----> 3 trainer.train()", ""]
    for n, (path, _, fn) in enumerate(frames, 100):
        out += [f"{SITE}{path} in {fn}(self, resume_from_checkpoint, trial, **kwargs)", f"    {n - 1}     x = 1",
                f"--> {n}     out = self.step(x)", ""]
    return out + [OOM]


def rich(frames):
    out = ["╭" + "─" * 30 + " Traceback (most recent call last) " + "─" * 30 + "╮"]
    for n, (path, _, fn) in enumerate(frames, 100):
        out += [f"│ {SITE}{path}:{n} in {fn}".ljust(110) + " │", "│".ljust(110) + " │",
                f"│ ❱ {n} │   out = self.step(x)".ljust(110) + " │"]
    return out + ["╰" + "─" * 110 + "╯", OOM]


def rich_wrapped(frames):  # a narrow console wraps `path.py:N in func` after the path
    out = ["╭" + "─" * 10 + " Traceback (most recent call last) " + "─" * 10 + "╮"]
    for n, (path, _, fn) in enumerate(frames, 100):
        out += [f"│ {SITE}{path}:".ljust(60) + " │", f"│ {n} in {fn}".ljust(60) + " │", "│".ljust(60) + " │"]
    return out + ["╰" + "─" * 60 + "╯", OOM]


def rich_wrapped_at_in(frames):  # the same, wrapped before or after ` in `
    out = ["╭" + "─" * 10 + " Traceback (most recent call last) " + "─" * 10 + "╮"]
    for k, (n, (path, _, fn)) in enumerate(enumerate(frames, 100)):
        head, tail = (f"{SITE}{path}:{n}", f"in {fn}") if k % 2 else (f"{SITE}{path}:{n} in", fn)
        out += [f"│ {head}".ljust(60) + " │", f"│ {tail}".ljust(60) + " │", "│".ljust(60) + " │"]
    return out + ["╰" + "─" * 60 + "╯", OOM]


DIALECTS = {"cpython": cpython, "windows": windows, "rank": rank, "lower": lower, "markdown": markdown,
            "ipython": ipython, "ipython_old": ipython_old, "rich": rich, "rich_wrapped": rich_wrapped,
            "rich_wrapped_at_in": rich_wrapped_at_in}


def collect(lines):
    """The facts `explain` reads from these lines (through the reader: rank prefixes, rich boxes,
    and the case a lower-cased paste lost, given back)."""
    from loradoctor.logs.engine import explain

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.log"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return dict(explain([str(path)]).facts)


@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_every_dialect_gives_every_phase(dialect, phase):
    facts = collect(DIALECTS[dialect](PHASES[phase]))
    want = EXPECTED.get(phase, phase)
    assert facts.get("oom.phase") == want, DIALECTS[dialect](PHASES[phase])[:8]
    assert facts.get("trace.location") == want


@pytest.mark.parametrize("text,frame", [
    ('  File "/x/transformers/trainer.py", line 1885, in train', Frame("/x/transformers/trainer.py", 1885, "train", "cpython")),
    ('File "C:\\Users\\Jane Doe\\lib\\trainer.py", line 7, in _inner_training_loop',
     Frame("C:\\Users\\Jane Doe\\lib\\trainer.py", 7, "_inner_training_loop", "cpython")),
    ('file "/x/trainer.py", line 12, in evaluate', Frame("/x/trainer.py", 12, "evaluate", "cpython")),
    ("File “/x/trainer.py”, line 12, in ", Frame("/x/trainer.py", 12, "", "cpython")),
    ("File /x/transformers/trainer.py:1885, in Trainer.train(self, resume_from_checkpoint, trial)",
     Frame("/x/transformers/trainer.py", 1885, "train", "ipython", "Trainer.train")),
    ("File ~/miniconda3/lib/python3.10/site-packages/peft/tuners/lora/bnb.py:497, in Linear4bit.forward(self, x)",
     Frame("~/miniconda3/lib/python3.10/site-packages/peft/tuners/lora/bnb.py", 497, "forward", "ipython", "Linear4bit.forward")),
    ("File c:\\program files\\python310\\lib\\trainer.py:3048, in trainer.evaluation_loop(self)",
     Frame("c:\\program files\\python310\\lib\\trainer.py", 3048, "evaluation_loop", "ipython", "trainer.evaluation_loop")),
    ("/usr/lib/python3/dist-packages/transformers/trainer.py in train(self, resume_from_checkpoint, trial, **kwargs)",
     Frame("/usr/lib/python3/dist-packages/transformers/trainer.py", 0, "train", "ipython-old", "train")),
    ("/x/transformers/trainer.py:1885 in train", Frame("/x/transformers/trainer.py", 1885, "train", "rich")),
    ("C:\\Users\\Jane Doe\\trainer.py:1885 in Trainer.train", Frame("C:\\Users\\Jane Doe\\trainer.py", 1885, "train", "rich")),
    ("Cell In[7], line 3", Frame("Cell In[7]", 3, "<module>", "cell")),
    ("Cell In[12], line 5, in run_eval", Frame("Cell In[12]", 5, "run_eval", "cell")),
    ("Input In [7], in <cell line: 3>()", Frame("Input In [7]", 0, "<cell line: 3>", "cell")),
    ("<ipython-input-7-3f2a1b> in <module>()", Frame("<ipython-input-7-3f2a1b>", 0, "<module>", "cell")),
])
def test_one_frame_per_dialect(text, frame):
    assert parse_frames(text) == [frame]


def test_a_joined_markdown_line_holds_all_its_frames():
    text = ('Traceback (most recent call last): File “/a/train.py”, line 3, in  main() File “/x/trainer.py”, '
            'line 9, in train return inner() File “/x/trainer.py”, line 12, in evaluate')
    assert [(f.line, f.function) for f in parse_frames(text)] == [(3, ""), (9, "train"), (12, "evaluate")]


@pytest.mark.parametrize("text", [
    "Loading checkpoint shards: 100%|██████████| 2/2", "    return forward_call(*args, **kwargs)",
    "See /x/trainer.py for details", "{'loss': 1.2, 'epoch': 0.1}", "File saved to /tmp/out.py",
    "Cell type: code", "Input shape: [4, 512]",
])
def test_other_lines_are_no_frames(text):
    assert parse_frames(text) == []


def test_old_ipython_frames_take_the_arrow_line():
    lines = ipython_old(PHASES["eval"])
    c = FactCollector()
    for i, t in enumerate(lines[:-1], 1):
        c.feed(make_line(t.encode(), "t.log", i))
    assert [f.line for f in c.trace._frames if f.dialect == "ipython-old"] == list(range(100, 100 + len(PHASES["eval"])))


def test_table_keys_do_not_collide_between_phases():
    table = frame_table()
    owner: dict[str, str] = {}
    for phase, keys in table.keys.items():
        for key in keys:
            assert owner.setdefault(key, phase) == phase, f"{key}: {owner[key]} and {phase}"
    assert "apply" not in table.move and "_apply" in table.move  # autograd's Function.apply is no move


def test_markdown_keys_match_the_table():
    assert frame_key("__init__") == frame_key("init") == "init"
    assert location_from_frames([("t.py", "inner_training_loop"), ("t.py", "loadstatedictintometamodel")]) == "load"
    # a move frame matches only as written: autograd's apply inside a step is no load
    assert location_from_frames([("x.py", "main"), ("torch/autograd/function.py", "apply")]) is None


# bitsandbytes 4-bit frames --------------------------------------------------------------------------

BNB_FORWARD = [("peft/tuners/lora/bnb.py", "Linear4bit", "forward"), ("bitsandbytes/nn/modules.py", "Linear4bit", "forward")]
BNB_INNER = [("bitsandbytes/autograd/_functions.py", None, "matmul_4bit"), ("torch/autograd/function.py", "Function", "apply"),
             ("bitsandbytes/autograd/_functions.py", "MatMul4Bit", "forward"),
             ("bitsandbytes/functional.py", None, "dequantize_4bit")]


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_bnb_4bit_frames_in_every_dialect(dialect):
    facts = collect(DIALECTS[dialect](PHASES["forward"] + BNB_FORWARD + BNB_INNER))
    assert facts.get("trace.bnb_4bit") is True and facts["oom.phase"] == "forward"


def test_bnb_4bit_from_the_source_line_under_a_bitsandbytes_frame():
    base = ["Traceback (most recent call last):",
            '  File "/x/bitsandbytes/nn/modules.py", line 490, in forward']
    with_source = collect(base + ["    out = bnb.matmul_4bit(x, self.weight.t(), bias=bias, quant_state=self.weight.quant_state)", OOM])
    assert with_source.get("trace.bnb_4bit") is True
    # 8-bit: the same file and function, another source line
    eight = collect(base + ["    out = bnb.matmul(x, self.weight, bias=self.bias, state=self.state)", OOM])
    assert "trace.bnb_4bit" not in eight
    assert "trace.bnb_4bit" not in collect(cpython(PHASES["forward"]))


def test_a_frame_line_cut_inside_the_function_name_keeps_its_phase():
    """A paste cut at a terminal / title width ends inside the innermost frame's name (issue 10)."""
    text = ('  File "/workspace/src/llamafactory/model/loader.py", line 162, in load_it\n'
            '  File "/root/.local/lib/python3.10/site-packages/transformers/modeling_utils.py", line 4833, in _load_pretrain\n')
    assert [f.function for f in parse_frames(text)][-1] == "_load_pretrain"
    assert location_from_frames(parse_frames(text)) == "load"
    cut_save = [("trainer.py", "train"), ("trainer.py", "_save_checkpo")]
    assert location_from_frames(cut_save) == "save"


@pytest.mark.parametrize("name", ["_load", "save_m", "evaluate_model_on_the_side"])
def test_short_or_unknown_names_are_not_read_as_cut(name):
    """Under 8 characters (`_load`, `save_m`) a cut name could begin anything; a name longer than every
    table name (`evaluate_model_on_the_side`) is no cut one."""
    assert location_from_frames([("train.py", "main"), ("train.py", name)]) is None


# --- frame headers cut before their function (issue 10: pastes cut at a terminal / title width) ----------

CUT_TRACE = ["Traceback (most recent call last):",
             '  File "/home/u/llm-ft/falcon/main.py", line 83, in my_app',
             "    model = AutoModelForCausalLM.from_pretrained(config['model_name'], load_in_4",
             '  File "/home/ubuntu/anaconda3/envs/ft-llm/lib/python3.9/site-packages/transform',
             "    return model_class.from_pretrained(",
             '  File "/home/ubuntu/anaconda3/envs/ft-llm/lib/python3.9/site-packages/transform',
             "    new_value = value.clone()",
             '  File "/home/ubuntu/anaconda3/envs/ft-llm/lib/python3.9/site-packages/torch/ut',
             "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.27 GiB. GPU"]


@pytest.mark.parametrize("text,frame", [
    ('File "/home/u/envs/ft/lib/python3.9/site-packages/transform', Frame("/home/u/envs/ft/lib/python3.9/site-packages/transform", 0, "", "cut")),
    ('File "/root/merge_lora_and_quantize.py", line', Frame("/root/merge_lora_and_quantize.py", 0, "", "cut")),
    ('File "/x/train_utils.py", li', Frame("/x/train_utils.py", 0, "", "cut")),
])
def test_a_frame_header_cut_before_its_function(text, frame):
    from loradoctor.logs.facts.frames import cut_frame_head

    assert parse_frames(text) == [] and cut_frame_head(text) == frame
    # cut after its line number, the header is a frame without function (which its caller's call fills in)
    assert parse_frames('File "/x/train_utils.py", line 23') == [Frame("/x/train_utils.py", 23, "", "cpython")]


@pytest.mark.parametrize("text", ['File "config.json" not found', 'File "/x/train.py", line 3, in main',
                                  'File "/x/train.py", lxne', "Filed under /x/y"])
def test_other_lines_are_no_cut_frame_headers(text):
    from loradoctor.logs.facts.frames import cut_frame_head

    assert cut_frame_head(text) is None


@pytest.mark.parametrize("source,called", [
    ("model = AutoModelForCausalLM.from_pretrained(config['model_name'], load_in_4", "from_pretrained"),
    (") = cls._load_pretrained_model(", "_load_pretrained_model"),
    ("new_error_msgs, offload_index, state_dict_index = _load_state_dict_into_meta", "_load_state_dict_into_meta"),
    ("return model_class.from_pretrained(", "from_pretrained"),
    ("state_dict[fqn] = state_dict[fqn].clone().detach()", ""),
    ("x == y(3)", ""), ("a" * 5000 + "(", ""),
])
def test_the_function_a_source_line_calls(source, called):
    from loradoctor.logs.facts.frames import called_function

    assert called_function(source) == called


def test_a_cut_frame_is_the_function_its_caller_calls():
    """The frames under `model = AutoModel.from_pretrained(` were cut inside their path: the first of them is
    from_pretrained, so the OOM happened while loading."""
    facts = collect(CUT_TRACE)
    assert facts["trace.location"] == "load" and facts["oom.phase"] == "load"
    # the same traceback with the calls taken out of the source lines places nothing
    plain = [line.replace("from_pretrained", "setup") for line in CUT_TRACE]
    assert "trace.location" not in collect(plain)


def test_a_traceback_header_cut_short_opens_the_traceback():
    """`... 24.81s/it][rank3]: Traceback (most recent ca`: the header glued to a bar and cut."""
    cut = [" 62%|######    | 8/13 [03:11<02:04, 24.81s/it]Traceback (most recent ca"] + CUT_TRACE[1:]
    assert collect(cut)["trace.location"] == "load"
    from loradoctor.logs.facts.trace import _cut_header

    assert _cut_header("Traceback (m") and not _cut_header("Traceback (mx") and not _cut_header("no Traceback here")


def test_every_phase_function_has_a_call_trigger():
    """A source line calling a function of a specific phase reaches the trace extractor (the engine feeds
    it only lines holding a trigger): one literal `name(`, or a shorter one the call ends with."""
    from loradoctor.logs.facts.trace import TraceExtractor

    table = frame_table()
    calls = [t for t, _ in TraceExtractor.TRIGGERS if t.endswith("(") and not t.startswith(".")]
    import yaml

    data = yaml.safe_load(Path("loradoctor/data/frames.yaml").read_text(encoding="utf-8"))
    names = {n for phase in data["specific"] for n in data["phases"][phase]["functions"]}
    assert {frame_key(n) for n in names} == set().union(*(table.keys[p] for p in data["specific"]))
    missing = sorted(n for n in names if not any((n + "(").endswith(c) for c in calls))
    assert not missing, f"no call trigger for {missing}"


def test_ipython_frame_headers_cut_take_the_arrow_lines_call():
    """IPython 8 cut at 80 columns: `File /x/auto_facto` with context lines around the arrow line; the cut
    frame is the function the arrow line of the frame above calls."""
    lines = ["---------------------------------------------------------------------------",
             "OutOfMemoryError                          Traceback (most recent call last)",
             "Cell In[11], line 2",
             "      1 # Reload model in FP16 and merge it with LoRA weights",
             "----> 2 base_model = AutoModelForCausalLM.from_pretrained(",
             "      3     model_name,",
             "",
             "File /usr/local/lib/python3.10/dist-packages/transformers/models/auto/auto_facto",
             "    565     model_class = _get_model_class(config, cls._model_mapping)",
             "--> 566     return model_class.from_pretrained(",
             "    567         pretrained_model_name_or_path, *model_args, config=config, **hub",
             "",
             "File /usr/local/lib/python3.10/dist-packages/accelerate/utils/modeling.py:347, i",
             "--> 347     new_value = value.to(device)",
             "",
             "OutOfMemoryError: CUDA out of memory. Tried to allocate 172.00 MiB. GPU 0 has a "]
    assert collect(lines)["trace.location"] == "load"
    from loradoctor.logs.facts.frames import cut_frame_head

    # outside a traceback, or as prose, no IPython header: `File not found`, `File /x.py:3, in f(...)` is whole
    assert cut_frame_head("File /x/modeling.py:347, i") is None and cut_frame_head("File not found", ipython=True) is None
    assert cut_frame_head("File /x/y.py:3, in f(a)", ipython=True) is None


def test_a_frame_with_an_absurd_line_number_is_read_without_a_crash():
    """A 4,400-digit line number (a mangled paste; fuzz campaign seed 22) is past what int() converts:
    the frame is kept, its line number read as unknown (0)."""
    from loradoctor.logs.facts.frames import parse_frames

    frames = parse_frames('  File "/home/z/peft/tuners/lora.py", line ' + "1" * 4400 + ", in save")
    assert frames and frames[0].line == 0 and frames[0].function == "save"
    assert parse_frames('  File "/home/z/train.py", line 88, in <module>')[0].line == 88
