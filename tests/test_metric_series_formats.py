"""Loss / grad-norm / learning-rate series printed by loops that are not the HF Trainer (issue 10 item 4):
timm, mmengine, Keras, torchtune, Lightning, fairseq, litgpt and hand-written lines / tqdm descriptions,
each as printed and as pasted (lower-cased, indented, quoted, in a markdown fence); and the repetition
tracker behind `metrics.loss_repeat_period`."""

from __future__ import annotations

import math
import random

import pytest

from conftest import explain_text
from loradoctor.logs.facts import FactCollector
from loradoctor.logs.facts.aggregate import LossAggregate, RepeatTracker
from loradoctor.logs.facts.metrics import parse_bar_description, parse_metric_record
from loradoctor.logs.reader import Line
from loradoctor.logs.rules.literals import split_alternatives

NAN = float("nan")

# (format, lines, expected (loss, grad_norm, learning rate) per record; None where the line has none)
FORMATS = {
    "timm": ([
        "Train: 3 [   0/1251 (  0%)]  Loss: 6.912 (6.912)  Time: 2.412s,  424.48/s  (2.412s,  424.48/s)  LR: 1.000e-03  Data: 1.812 (1.812)",
        "Train: 3 [ 100/1251 (  8%)]  Loss: 6.905 (6.910)  Time: 0.412s, 2485.44/s  (0.431s, 2375.02/s)  LR: 1.000e-03  Data: 0.010 (0.028)",
        "Train: 3 [ 200/1251 ( 16%)]  Loss: nan (nan)  Time: 0.413s, 2480.12/s  (0.430s, 2376.90/s)  LR: 1.000e-03  Data: 0.011 (0.027)",
    ], [(6.912, None, 1e-3), (6.905, None, 1e-3), (NAN, None, 1e-3)]),
    "hand-spaced": ([
        "epoch 1 step 10 loss 0.0",
        "epoch 1 step 20 loss 0.0",
        "Step 30 | Loss 0.0 | Grad Norm nan | LR 2e-4",
    ], [(0.0, None, None), (0.0, None, None), (0.0, NAN, 2e-4)]),
    "hand-tqdm-description": ([
        "Epoch 2/3 | step 40 | loss=1.2034:  13%|█▎        | 40/300 [00:10<01:05,  3.98it/s]",
        "Epoch 2/3 | step 50 | loss=nan:  17%|█▋        | 50/300 [00:12<01:03,  3.97it/s]",
    ], [(1.2034, None, None), (NAN, None, None)]),
    "fairseq": ([
        "2021-03-01 10:00:00 | INFO | train_inner | epoch 001:    100 / 1000 loss=7.123, nll_loss=6.9, ppl=119.4, wps=12000, ups=3.2, wpb=3800, bsz=128, num_updates=100, lr=1.25e-05, gnorm=1.812, loss_scale=128, train_wall=31, wall=35",
        "2021-03-01 10:05:00 | INFO | train | epoch 001 | loss 6.511 | nll_loss 6.2 | ppl 80.1 | wps 12000 | num_updates 200 | lr 2.5e-05 | gnorm 1.4 | train_wall 31 | wall 70",
        '{"epoch": 2, "update": 1.1, "loss": "nan", "nll_loss": "nan", "lr": "2.5e-05", "gnorm": "nan", "num_updates": "210"}',
    ], [(7.123, 1.812, 1.25e-05), (6.511, 1.4, 2.5e-05), (NAN, NAN, 2.5e-05)]),
    "mmengine": ([
        "2023/05/01 10:00:00 - mmengine - INFO - Epoch(train)  [1][ 50/500]  lr: 1.0000e-04  eta: 1:00:00  time: 0.5000  data_time: 0.0100  memory: 6814  grad_norm: 3.2000  loss: 0.6931  loss_cls: 0.6931",
        "2023/05/01 10:01:00 - mmengine - INFO - Epoch(train)  [1][100/500]  lr: 1.0000e-04  eta: 0:59:00  time: 0.5000  data_time: 0.0100  memory: 6814  grad_norm: nan  loss: nan  loss_cls: nan",
    ], [(0.6931, 3.2, 1e-4), (NAN, NAN, 1e-4)]),
    "lightning": ([
        "Epoch 0:  45%|████▌     | 450/1000 [01:23<01:41, 5.41it/s, v_num=0, train_loss=0.000]",
        "Epoch 0:  46%|████▌     | 460/1000 [01:25<01:40, 5.41it/s, v_num=0, train_loss=0.000]",
    ], [(0.0, None, None), (0.0, None, None)]),
    # Lightning prints a nan loss with a trailing `.0` (round 20: t5-large under precision="16")
    "lightning-nan-dot-zero": ([
        "Epoch 0:   1%|          | 11/1563 [00:08<20:14,  1.28it/s, v_num=7, train_loss=2.410]",
        "Epoch 0:   1%|          | 12/1563 [00:09<20:14,  1.28it/s, v_num=7, train_loss=nan.0]",
    ], [(2.41, None, None), (NAN, None, None)]),
    "keras": ([
        "100/100 [==============================] - 5s 50ms/step - loss: 2.3026 - accuracy: 0.1000",
        "100/100 [==============================] - 5s 50ms/step - loss: nan - accuracy: 0.1000",
    ], [(2.3026, None, None), (NAN, None, None)]),
    "torchtune-logger": ([
        "Step 12 | loss:1.8721 lr:2e-05 tokens_per_second_per_gpu:1234.5 peak_memory_active:18.02",
        "Step 13 | loss:nan lr:2e-05 grad_norm:nan tokens_per_second_per_gpu:1230.1 peak_memory_active:18.02",
    ], [(1.8721, None, 2e-05), (NAN, NAN, 2e-05)]),
    "litgpt": ([
        "Epoch 1 | iter 1 step 0 | loss train: 2.112, val: n/a | iter time: 512.33 ms",
        "Epoch 1 | iter 2 step 1 | loss train: nan, val: n/a | iter time: 250.10 ms (step)",
    ], [(2.112, None, None), (NAN, None, None)]),
}


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b)


def _collect(texts):
    c = FactCollector()
    for i, t in enumerate(texts, 1):
        c.feed(Line(file="t.log", lineno=i, text=t, rank=None, time_s=None, raw=t, input_index=0))
    return c.finish().flat()


VARIANTS = {
    "as printed": lambda lines: lines,
    "lower-cased": lambda lines: [x.lower() for x in lines],
    "indented": lambda lines: ["    " + x for x in lines],
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_gives_one_record_per_line(fmt, variant):
    """The collector (line by line) reads every line of the format as one record with its numbers."""
    lines, expected = FORMATS[fmt]
    f = _collect(VARIANTS[variant](lines))
    assert f["metrics.steps"] == len(expected)
    finite = [e[0] for e in expected if not math.isnan(e[0])]
    assert f["metrics.loss_nan_count"] == len(expected) - len(finite)
    if finite:
        assert f["metrics.first_loss"] == pytest.approx(finite[0])
    gns = [e[1] for e in expected if e[1] is not None]
    assert f["metrics.grad_norm_nan_count"] == sum(math.isnan(g) for g in gns)
    if any(not math.isnan(g) for g in gns):
        assert f["metrics.grad_norm_max"] == pytest.approx(max(g for g in gns if not math.isnan(g)))
    lrs = [e[2] for e in expected if e[2] is not None]
    if lrs:
        assert f["metrics.lr_max"] == pytest.approx(max(lrs))
    else:
        assert "metrics.lr_max" not in f


PASTES = {
    "lower-cased": lambda text: text.lower(),
    "indented": lambda text: "".join("    " + x + "\n" for x in text.splitlines()),
    "quoted": lambda text: "".join("> " + x + "\n" for x in text.splitlines()),
    "markdown fence": lambda text: "```\n" + text + "```\n",
}


@pytest.mark.parametrize("paste", list(PASTES))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_survives_the_paste(tmp_path, fmt, paste):
    """Through the engine (prefilter, reader, recaser): the same record count and nan count however it was pasted."""
    lines, expected = FORMATS[fmt]
    report = explain_text(tmp_path, PASTES[paste]("\n".join(lines) + "\n"))
    assert report.facts.get("metrics.steps") == len(expected), report.facts
    assert report.facts["metrics.loss_nan_count"] == sum(math.isnan(e[0]) for e in expected)


def test_parsers_by_hand():
    assert parse_metric_record("* Epoch [1/5], Step [100/600], Loss: 0.2143")["loss"] == 0.2143
    assert parse_metric_record("EPOCH 1 STEP 10 LOSS 0.0")["loss"] == 0.0
    assert parse_metric_record("`epoch 1 step 10 loss 0.5`")["loss"] == 0.5
    assert parse_metric_record("Epoch 3 | Loss Train: 0.4132 | Loss Val: 0.5")["loss"] == 0.4132
    r = parse_metric_record("| epoch 001 | loss 7.123 | nll_loss 6.9 | lr 2.5e-05 | gnorm 1.4 | wall 70")
    assert r == {"loss": 7.123, "learning_rate": 2.5e-05, "grad_norm": 1.4}
    # prose and validation losses are no training records
    assert parse_metric_record("the loss function is cross entropy") is None
    assert parse_metric_record("val loss 2.3 at epoch 1") is None
    assert parse_bar_description("Epoch 1/3 | step 40 | loss=0.25:  13%|█▎   | 40/300 [00:10<01:05,  3.98it/s]") == {"loss": 0.25}
    assert parse_bar_description("Training:  13%|█▎   | 40/300 [00:10<01:05,  3.98it/s]") is None
    assert parse_bar_description("%| no description") is None


def test_prose_about_loss_makes_no_record():
    f = _collect(["We compute the loss over the answer tokens only.", "Loss scale is dynamic.",
                  "step 1: the loss went down", "Training Loss  Validation Loss"])
    assert "metrics.steps" not in f


# --- the repetition tracker ----------------------------------------------------------------------

EPOCH = [2.4113, 2.2871, 2.3502, 2.519]


@pytest.mark.parametrize("series, result", [
    (EPOCH * 3, (4, 8)),
    (EPOCH * 3 + EPOCH[:2], (4, 10)),      # a last epoch cut short still repeats
    (EPOCH * 2, (4, 4)),
    (EPOCH * 3 + [1.0], None),             # the last record breaks it
    (EPOCH, None),                         # no repetition
    ([1.0] * 12, None),                    # constant: loss_flat_steps' case
    (EPOCH + [NAN] + EPOCH, None),         # a nan ends it
    ([0.52, 0.51, 0.52, 0.51, 0.52], (2, 3)),
])
def test_repeat_tracker(series, result):
    one, bulk = RepeatTracker(), RepeatTracker()
    for x in series:
        one.add(x)
    bulk.add_many(series)
    assert one.result() == result and bulk.result() == result


def test_repeat_tracker_beyond_its_store():
    """Past STORE records each one is checked against the record a period earlier, nothing more kept."""
    store = RepeatTracker.STORE
    series = EPOCH * (store // len(EPOCH) + 50)
    for chunk in (1, 777, len(series)):
        t = RepeatTracker()
        for i in range(0, len(series), chunk):
            t.add_many(series[i:i + chunk])
        assert t.result() == (4, len(series) - 4) and len(t.seq) == store
    t = RepeatTracker()
    t.add_many(series + [9.0])
    assert t.result() is None
    t = RepeatTracker()
    t.add_many([random.random() for _ in range(store + 10)])
    assert t.result() is None and t.broken


def test_repeat_facts_published():
    agg = LossAggregate()
    agg.add_many(EPOCH * 3)
    v = {}
    agg.publish(v)
    assert v["metrics.loss_repeat_period"] == 4 and v["metrics.loss_repeated_records"] == 8
    agg = LossAggregate()
    for x in [3.0, 2.5, 2.0, 1.8, 1.7]:
        agg.add(x)
    v = {}
    agg.publish(v)
    assert "metrics.loss_repeat_period" not in v


@pytest.mark.parametrize("text", [
    "loss train" + " " * 20000 + "x",
    "epoch 1 " + "|" * 20000,
    "|" + " " * 20000 + "step x",
    "step 1 " + "loss " * 5000,
    "epoch" + " " * 20000 + "loss 1",
    "Epoch 1 | loss train: " + "1" * 20000 + "x",
    "loss 0.0" + "%|" * 10000,
    "epoch 1 " + "9" * 20000 + "%|",
])
def test_hostile_lines_are_linear(text):
    """The series parsers on long runs of the characters their patterns repeat: well under a second."""
    import time

    started = time.process_time()
    parse_metric_record(text)
    parse_bar_description(text)
    assert time.process_time() - started < 0.5


# --- the series through the rules: precision decides which nan cause comes first -------------------

_STABLE_THEN_NAN = "".join(f"Step {i} | loss:{2.0 - i * 0.01:.4f} lr:2e-05 grad_norm:0.{40 + i}\n" for i in range(1, 13)) \
    + "".join(f"Step {i} | loss:nan lr:2e-05 grad_norm:nan\n" for i in range(13, 17))


def _causes(report):
    return [(f.cause, f.rule) for f in report.findings]


def test_nan_after_stable_stretch_fp16_names_overflow_first(tmp_path):
    report = explain_text(tmp_path, "INFO: Using 16bit Automatic Mixed Precision (AMP)\n" + _STABLE_THEN_NAN)
    assert report.facts["metrics.precision"] == "fp16"
    assert report.findings[0].cause == "nan.fp16_overflow", _causes(report)


def test_nan_after_stable_stretch_bf16_names_divergence_and_drops_overflow(tmp_path):
    report = explain_text(tmp_path, "training with bf16=True, lr=2e-05\n" + _STABLE_THEN_NAN)
    assert report.facts["metrics.precision"] == "bf16"
    assert report.findings[0].cause == "nan.divergence", _causes(report)
    assert "nan.fp16_overflow" not in [c for c, _ in _causes(report)]


def test_nan_after_stable_stretch_unknown_precision_says_both(tmp_path):
    report = explain_text(tmp_path, _STABLE_THEN_NAN)
    assert "metrics.precision" not in report.facts
    causes = [c for c, _ in _causes(report)]
    assert causes[0] == "nan.fp16_overflow" and "nan.divergence" in causes, _causes(report)
    alt = report.findings[0].differential
    assert any(a["cause"] == "nan.divergence" and "bf16" in a["tells_apart"] for a in alt), alt


def test_zero_loss_from_first_record_in_a_hand_written_loop(tmp_path):
    text = "".join(f"    epoch 1 step {i * 10} loss 0.0\n" for i in range(1, 6))
    report = explain_text(tmp_path, text.lower())
    assert report.findings[0].rule == "loss-zero-from-start", _causes(report)


def test_short_stable_stretch_unknown_precision_still_offers_divergence(tmp_path):
    """Six finite records, no climb, then nan: the numbers alone cannot rule divergence out (before the
    precision counted, the differential dropped it under ten finite records)."""
    losses = [2.0, 1.97, 1.99, 1.975, 1.98, 1.985]  # no climb: a rise ratio of 1.01
    text = "".join(f"Step {i} | loss:{x:.4f} lr:2e-04\n" for i, x in enumerate(losses, 1)) \
        + "".join(f"Step {i} | loss:nan lr:2e-04\n" for i in range(7, 10))
    report = explain_text(tmp_path, text)
    assert report.findings[0].cause == "nan.fp16_overflow", _causes(report)
    assert [a["cause"] for a in report.findings[0].differential][:1] == ["nan.divergence"]
    fp16 = explain_text(tmp_path, "fp16=True,\n" + text, name="fp16.log")
    assert fp16.findings[0].cause == "nan.fp16_overflow"
    assert "nan.divergence" not in [a["cause"] for a in fp16.findings[0].differential]


@pytest.mark.parametrize("losses, trailing", [
    ([1.0, 0.9, NAN], 1),
    ([1.0, NAN, 0.9], 0),                 # the loss came back
    ([1.0, NAN, NAN, 0.9, NAN, NAN], 2),
    ([NAN, NAN], 2),
    ([1.0, 0.9], None),                   # no nan: no fact
])
def test_trailing_nan_count(losses, trailing):
    for cut in range(len(losses) + 1):  # record by record and in two batches: the same
        one, bulk = LossAggregate(), LossAggregate()
        for x in losses:
            one.add(x)
        bulk.add_many(losses[:cut])
        bulk.add_many(losses[cut:])
        for agg in (one, bulk):
            v = {}
            agg.publish(v)
            assert v.get("metrics.trailing_nan_count") == trailing


NOTEBOOK_TABLE = ["Step\tTraining Loss\tValidation Loss", "10\t1.250000\tNo log", "20\t-\t1.100000", "30\tnan\tnan"]
TABLE_PREFIXES = {
    "none": lambda i, x: x,
    "quoted": lambda i, x: "> " + x,
    "quoted twice": lambda i, x: "> > " + x,
    "prompt": lambda i, x: ">>> " + x,
    "line numbers": lambda i, x: f"{i:>4}  " + x,
    "compose": lambda i, x: "trainer-1  | " + x,
    "kubelet": lambda i, x: f"2024-05-01T10:00:0{i}.123Z stdout F " + x,
    "rank": lambda i, x: "[rank0]: " + x,
}


@pytest.mark.parametrize("prefix", list(TABLE_PREFIXES))
def test_a_notebook_table_behind_a_line_prefix(tmp_path, prefix):
    """A notebook Trainer table pasted behind a prefix the reader peels (quote markers, prompts, line
    numbers, compose / kubelet / rank prefixes) gives the same rows as without it; the `-` cell of a row
    is no line number to peel."""
    add = TABLE_PREFIXES[prefix]
    lines = ["some output"] + [add(i, x) for i, x in enumerate(NOTEBOOK_TABLE, 2)] + ["after the table"]
    report = explain_text(tmp_path, "\n".join(lines) + "\n")
    assert report.facts.get("metrics.steps") == 2, report.facts  # the `-` row holds no training loss
    assert report.facts["metrics.first_loss"] == pytest.approx(1.25)
    assert report.facts["metrics.loss_nan_count"] == 1


def test_a_prefixed_table_row_is_no_table_without_its_header(tmp_path):
    """Rows behind `> ` with no header above them are no table (only a header opens one)."""
    report = explain_text(tmp_path, "> 10\t1.25\tNo log\n> 20\t1.10\t1.0\n")
    assert not report.facts.get("metrics.steps")


@pytest.mark.parametrize("block", [
    b"> Step\tTraining Loss\n> 1\t0.5\n" * 5000,  # many prefixed headers: each line read once
    b"> " + b"Step Training Loss " * 20000 + b"\n",  # many headers on one line
    b"> a" + b"-1" * 100000 + b" Training Loss\n",  # a long prefix-like word before the header
])
def test_prefixed_table_headers_are_linear(block):
    """Finding prefixed headers and peeling their rows reads each line once: ~0.2 s on a quiet core (a
    quadratic walk takes minutes here); the limit leaves room for a loaded CI machine."""
    import time

    started = time.process_time()
    FactCollector().feed_table_block(block, lambda raw, n: None)
    assert time.process_time() - started < 2.0


SUMMARY = ("{'train_runtime': 95.41, 'train_samples_per_second': 4.19, 'train_steps_per_second': 0.524, "
           "'train_loss': 0.0, 'epoch': 3.0}")


@pytest.mark.parametrize("lines", [
    [SUMMARY],
    [SUMMARY.lower()],
    # cut by a hard wrap at 80 columns: the record ends on the next line
    [SUMMARY[:80], SUMMARY[80:]],
    # the engine's whole path, where the continuation holds none of the extractor's words
    "engine",
])
def test_the_end_of_training_record_gives_its_average_loss_and_run_time(lines, tmp_path):
    if lines == "engine":
        f = explain_text(tmp_path, SUMMARY[:80] + "\n" + SUMMARY[80:] + "\n").facts
    else:
        f = _collect(lines)
    assert f["metrics.train_finished"] is True
    assert f["metrics.train_loss"] == 0.0 and f["metrics.train_runtime"] == pytest.approx(95.41)
    assert "metrics.steps" not in f  # the summary is no training step


def test_a_nan_average_loss_and_an_unended_cut_record_give_no_average():
    f = _collect([SUMMARY.replace("'train_loss': 0.0", "'train_loss': nan")])
    assert "metrics.train_loss" not in f and f["metrics.train_finished"] is True
    # a cut record whose next line does not end it: the next line is read as any other
    f = _collect([SUMMARY[:80], "{'loss': 1.25, 'grad_norm': 0.5, 'learning_rate': 0.0002, 'epoch': 0.1}"])
    assert "metrics.train_loss" not in f and f["metrics.steps"] == 1


def test_precision_hints_cover_every_form_the_regexes_match():
    """precision_of answers None without its regexes for a line holding none of _PRECISION_HINTS (an eval
    record whose numbers hold `16`, ~30 us saved a line): every top-level alternative of both regexes
    spells one of the hints literally, and lines of each form are still read."""
    from loradoctor.logs.facts.metrics import _BF16_ON_RE, _FP16_ON_RE, _PRECISION_HINTS, precision_of

    for regex in (_FP16_ON_RE, _BF16_ON_RE):
        alternatives = split_alternatives(regex.pattern)  # cut at its top-level `|`
        assert len(alternatives) == 8
        for alternative in alternatives:
            assert any(hint in alternative for hint in _PRECISION_HINTS), alternative
    for line, want in [("fp16=True", "fp16"), ("--bf16", "bf16"), ("mixed_precision: 'fp16'", "fp16"),
                       ("compute dtype: torch.bfloat16", "bf16"), ('"fp16": {"enabled": true', "fp16"),
                       ("Bfloat16 = FALSE", "fp16"), ("Bfloat16 = TRUE", "bf16"),
                       ("Using 16bit Automatic Mixed Precision (AMP)", "fp16"),
                       ("Using bfloat16 Automatic Mixed Precision (AMP)", "bf16"), ("  dtype: bf16", "bf16"),
                       ("{'eval_loss': 1.2616, 'eval_runtime': 41.2, 'epoch': 0.16}", None)]:
        assert precision_of(line) == want, line
        found = "fp16" if _FP16_ON_RE.search(line) else "bf16" if _BF16_ON_RE.search(line) else None
        assert found == want, line


def test_metric_matches_remembered_per_digit_blind_text_are_the_regex_matches():
    """metrics._metric_matches cuts the spans remembered for a line's digit-blind text from the line
    itself: the same (key, number, unit) as _METRIC_RE.finditer on every line, whatever came before."""
    import random

    from loradoctor.logs.facts import metrics

    rng = random.Random(11)
    shapes = ["{{'eval_loss': {a}, 'eval_runtime': {b}, 'epoch': {c}}}", "step {a} | loss {b} | lr {c}e-0{d}",
              "loss={a} grad_norm={b} gpu_mem={c}{u} lr: {d}", '{{"loss": "{a}", "grad_norm": {b}}}',
              "train/loss_{d}: {a}, layer{d}.w: {b}", "Iter {d}: Train loss {a}, It/sec {b}", "x{d}={a}.{b}e{c}",
              "mem {a} GB, loss:{b}{u} 1{d}={c}"]
    assert metrics._METRIC_BLIND in ([], [True])
    for _ in range(3000):
        text = rng.choice(shapes).format(
            a=rng.choice(["0.5", "12", "nan", "-inf", "1e-05", "3.25", "7"]), b=rng.randint(0, 10 ** rng.randint(0, 6)),
            c=round(rng.random() * 10, rng.randint(0, 4)), d=rng.randint(0, 99), u=rng.choice(["", "G", "GiB", "mb"]))
        want = [m.group(1, 2, 3) for m in metrics._METRIC_RE.finditer(text)]
        assert metrics._metric_matches(text) == want, text
    assert metrics._METRIC_BLIND == [True] and metrics._METRIC_SPANS


def test_repeat_tracker_gives_up_early_only_where_no_repeat_can_follow():
    """The tracker stops once records - border > STORE / 2 (no later record can make a repeat); the same
    result as tracking to the end, on series that repeat from the start, late, never, or break."""
    class ToTheEnd(RepeatTracker):
        GIVE_UP_EARLY = False

    rng = random.Random(17)
    store = RepeatTracker.STORE
    series_list = [[rng.random() for _ in range(store + 20)]]
    for _ in range(24):
        period = rng.choice([2, 3, 5, 50, 700, store // 2 - 1, store // 2, store // 2 + 1])
        head = [round(rng.random(), 2) for _ in range(period)]
        n = rng.choice([period * 2 - 1, period * 2, store - 1, store, store + 30])
        series = (head * (n // period + 2))[:n]
        if rng.random() < 0.3:
            series[rng.randrange(len(series))] = 9.0  # one record breaks it
        if rng.random() < 0.2:
            series = [rng.random() for _ in range(rng.randrange(1, store // 2 + 5))] + series  # a head first
        series_list.append(series[: store + 40])
    for series in series_list:
        early, full = RepeatTracker(), ToTheEnd()
        early.add_many(series)
        full.add_many(series)
        assert early.result() == full.result(), len(series)
        cut = rng.randrange(len(series))  # and record by record, stopped anywhere
        early, full = RepeatTracker(), ToTheEnd()
        for x in series[:cut]:
            early.add(x)
            full.add(x)
        assert early.result() == full.result()
    t = RepeatTracker()
    t.add_many([rng.random() for _ in range(store)])
    assert t.broken and t.n <= store // 2 + 1  # random losses: stopped after half the store


def test_a_model_cast_to_half_is_fp16(tmp_path):
    """`model = model.half()` (pure half precision, no fp32 master weights) counts as fp16; another tensor's
    .half() does not. A loss that drops to 0 with eval_loss nan then reads as fp16 overflow first."""
    from loradoctor.logs.facts.metrics import precision_of

    for line, want in [("    model = model.half()", "fp16"), ("model = AutoModel.from_pretrained(p).half()", "fp16"),
                       ("self.base_model.half()", "fp16"), ("x = x.half()", None), ("inputs.half()", None)]:
        assert precision_of(line) == want, line
    records = ["{'loss': 1.9873, 'learning_rate': 0.0002, 'epoch': 0.0}"] + \
        [f"{{'loss': 0.0, 'learning_rate': 0.0002, 'epoch': 0.0{i}}}" for i in range(1, 4)] + \
        ["{'eval_loss': nan, 'eval_runtime': 41.2, 'epoch': 0.03}"]
    half = explain_text(tmp_path, "model = model.half()\n" + "\n".join(records) + "\n", name="half.log")
    assert half.facts.get("metrics.precision") == "fp16"
    assert half.findings[0].cause == "nan.fp16_overflow", _causes(half)
    plain = explain_text(tmp_path, "\n".join(records) + "\n", name="plain.log")
    assert "metrics.precision" not in plain.facts


def test_advised_precision_is_not_the_runs(tmp_path):
    """A reply's advice ("please add bf16=True and change fp16=False", "try --bf16") is not the run's precision;
    the user's own past-tense account ("I set fp16=True") and code lines are. With the advice read as the run's,
    a nan eval_loss in an fp16 run looked like a bf16 run's."""
    from loradoctor.logs.facts.metrics import precision_of

    for line, want in [("please add bf16=True and change fp16=False in the HF trainer.", None),
                       ("try --bf16 instead", None), ("You should set bf16=True.", None),
                       ("I set fp16=True and the loss is nan", "fp16"), ("    bf16=True,", "bf16"),
                       ("args = TrainingArguments(output_dir='o', fp16=True)", "fp16"),
                       ("Using 16bit Automatic Mixed Precision (AMP)", "fp16"),
                       ("we trained with fp16=True. Please add bf16=True", "fp16")]:
        assert precision_of(line) == want, line
    records = ["{'loss': 1.2034, 'learning_rate': 0.0003, 'epoch': 0.25}",
               "{'eval_loss': nan, 'eval_runtime': 41.2, 'epoch': 0.25}"]
    advised = explain_text(tmp_path, "\n".join(records) + "\nplease add bf16=True to the trainer\n", name="a.log")
    assert "metrics.precision" not in advised.facts
