"""prose.oom_phase / prose.gpu_oom: the phase CJK prose names next to an OOM word (loradoctor/data/prose_words.yaml)."""

from __future__ import annotations

import pytest

from loradoctor.logs.facts.prose import line_phase, prose_table


@pytest.mark.parametrize("text, phase", [
    ("合并lora权重报错显存溢出", "merge"),
    ("微调结束后，合并的时候报错显存溢出。使用4090，显存24G。", "merge"),
    ("QWEN1.5系列模型在训练时进入eval阶段就报OOM", "eval"),  # the nearest phase word before the OOM wins
    ("两张显卡，各16G，共32G显存，推理报显存不足的错误", "generate"),
    ("베이스 모델을 로딩하는 부분에서, 아래와 같은 오류가 생기고 있습니다.", "load"),  # "the error below"
    ("평가(Evaluation) 단계에 들어가면 메모리가 늘고 결국 OOM이 발생했습니다.", "eval"),
    ("加载完模型后，提交后又报显存不足的错误", None),  # 加载完: loading finished, passed over
    ("baichaun2-13B-Chat微调在评估后会爆显存", None),  # 评估后: after the evaluation, then 微调 (training)
    ("差不多训练到10% 就会显存溢出", None),  # a training step
    # the OOM word decides over a later weak one (显存 in a clause that says inference was fine)
    ("训练时OOM，推理的时候显存完全够用。", None),
    ("推理的时候显示需要申请10Gb的显存", "generate"),  # no OOM word: the weak anchor 显存 places it
    # a phase named with training as one of two is no phase ("when training or inferring")
    ("메모리 문제는 주로 딥러닝 모델을 학습하거나 추론할 때 발생하는 GPU의 메모리 부족으로 인해 발생한다.", None),
    ("训练或推理时都会爆显存", None),
    ("微调后推理时爆显存", "generate"),  # 后 is no `either` word: the inference after training
    # a phase that is one addend of what did not fit ("loading takes 6 GB, plus the activations")
    ("SDXL底模本身加载就要接近6GB，再加上1024分辨率的激活值，6G显存根本扛不住。", None),
    ("加载模型需要20G显存，我只有16G", "load"),
])
def test_line_phase(text, phase):
    got, _ = line_phase(text)
    assert got == phase


def test_gpu_oom_words_and_host_ram():
    assert line_phase("训练到第30步就爆显存了")[1] is True
    assert line_phase("메모리 부족으로 학습이 멈췄습니다")[1] is True
    # 内存 is host RAM, not an anchor here
    assert line_phase("内存爆了，加载模型失败") == (None, False)


def test_latin_words_only_whole():
    # `eval_step` counts as eval; `retrain` is no `train`, `medieval` no `eval`
    assert line_phase("一到eval_step就爆OOM了")[0] == "eval"
    assert line_phase("medieval数据集合并后爆显存")[0] is None


def test_a_config_name_that_holds_a_phase_word_names_no_phase():
    # modules_to_save lists modules trained in full: no saving; `save` on its own still counts
    assert line_phase("modules_to_save 默认包含 embed_tokens 和 lm_head,显著增加显存占用。")[0] is None
    assert line_phase("一到save就爆显存")[0] == "save"
    assert "modules_to_save" in prose_table().not_phases
    # 流式加载 streams the dataset: no model load; 加载 on its own still counts
    assert line_phase("没用流式加载，在packing快结束的时候报oom")[0] is None
    assert line_phase("加载模型的时候就报oom")[0] == "load"


def test_table_is_data():
    t = prose_table()
    phases = {p for _, p in t.phases}
    assert phases == {"load", "merge", "save", "eval", "generate", "train"}
    assert "显存不足" in t.anchors and "显存" in t.weak
    # longest words first, so 读取模型 is tried before shorter words at the same place
    lengths = [len(w) for w, _ in t.phases]
    assert lengths == sorted(lengths, reverse=True)


def test_memory_growth_words_need_a_memory_word_on_the_line(tmp_path):
    # prose.memory_growth: memory said to grow, in any script; `loss keeps increasing` is no memory growth
    from loradoctor.logs import engine

    def facts(text):
        p = tmp_path / "paste.log"
        p.write_text(text, encoding="utf-8")
        return engine.explain([str(p)]).facts

    assert facts("为什么训练阶段的显存一直在往上涨？一会就 oom 了\n").get("prose.memory_growth") is True
    assert facts("it runs fine for a few steps and then goes oom\n").get("prose.memory_growth") is True
    assert "prose.memory_growth" not in facts("lora training, the loss keeps increasing after epoch 2\n")
    assert "一直在往上涨" in prose_table().growth


def test_every_growth_word_holds_a_trigger():
    # the engine decodes only lines holding a TRIGGERS literal: a growth word without one would never be read
    from loradoctor.logs.facts.prose import ProseExtractor
    lits = [(t.lower() if ci else t) for t, ci in ProseExtractor.TRIGGERS]
    assert all(any(lit in w.lower() for lit in lits) for w in prose_table().growth)
