"""The shell's signal lines in the user's locale (loradoctor/data/os_strings.yaml, loradoctor/logs/oswords.py):
read as the English ones the rules know, quoted as pasted; prose that holds the same word is left alone."""

from __future__ import annotations

import pytest

from loradoctor.logs import engine, oswords, reader


@pytest.mark.parametrize("line, want", [
    ("Getötet", "Killed"),
    ("убито", "Killed"),
    ("Processus arrêté", "Killed"),
    ("MATADO", "Killed"),
    ("Lỗi phân đoạn (đã xuất tập tin lõi)", "Segmentation fault (core dumped)"),
    ("Speicherzugriffsfehler (Speicherabzug geschrieben)", "Segmentation fault (core dumped)"),
    ("Erreur de segmentation (core dumped)", "Segmentation fault (core dumped)"),
    ("./train.sh: Zeile 38: 126508 Getötet                python train.py",
     "./train.sh: line 38: 126508 Killed                python train.py"),
    ("/var/spool/slurm/job1/slurm_script: строка 12: 4242 Ошибка сегментирования (стек памяти сброшен на диск) python x.py",
     "/var/spool/slurm/job1/slurm_script: line 12: 4242 Segmentation fault (core dumped) python x.py"),
    ("run.sh: ligne 3 : 99 Processus arrêté python x.py", "run.sh: line 3: 99 Killed python x.py"),
    ("[1]+  Morto                   nohup python train.py", "[1]+  Killed                   nohup python train.py"),
    ("已杀死", "Killed"),
    ("段错误 (核心已转储)", "Segmentation fault (core dumped)"),
    ("总线错误", "Bus error"),
])
def test_a_localized_signal_line_reads_as_the_english_one(line, want):
    assert oswords.unlocalize(line) == want


@pytest.mark.parametrize("line", [
    "der Prozess wurde getötet, als der Speicher voll war",  # prose, not the shell's line
    "Killed", "{'loss': 0.41, 'learning_rate': 0.0002, 'epoch': 0.5}",
    "./train.sh: Zeile 38: Syntaxfehler beim unerwarteten Symbol",
    "matado" * 100,  # longer than any shell signal line
])
def test_other_lines_are_left_alone(line):
    assert oswords.unlocalize(line) == line


def test_every_signal_string_is_an_extractor_trigger():
    """The engine decodes only lines holding a trigger: each localized string, as written and lower-cased."""
    from loradoctor.logs.facts.host import HostExtractor

    triggers = {t for t, _ in HostExtractor.TRIGGERS}
    for word, _ in oswords.os_words().words:
        assert word in triggers and word.lower() in triggers, word


def test_the_reader_keeps_the_line_as_pasted_for_evidence():
    line = reader.make_line("Loading checkpoint shards:  52%|█████▏    | 17/33 [00:41<00:38,  2.41s/it]Getötet"
                            .encode(), "x.log", 7)
    assert line.text == "Killed"
    assert line.quote().endswith("]Getötet")


@pytest.mark.parametrize("word", ["Getötet", "Убито", "Processus arrêté", "Matado", "Morto", "已杀死"])
def test_a_localized_killed_after_a_shards_bar_is_host_ram(tmp_path, word):
    log = tmp_path / "k.log"
    text = f"Loading checkpoint shards:  36%|███▋      | 12/33 [00:19<00:34,  1.63s/it]{word}\n"
    for variant in (text, text.lower()):
        log.write_text(variant, encoding="utf-8")
        report = engine.explain([str(log)])
        assert report.findings and report.findings[0].cause == "oom.host_ram", (word, variant)
        assert word.lower() in report.findings[0].evidence[0].text.lower()


@pytest.mark.parametrize("line, want", [
    ("ping: huggingface.co: Fallo temporal en la resolución del nombre",
     "ping: huggingface.co: Temporary failure in name resolution"),
    ("ping: huggingface.co: temporärer fehler bei der namensauflösung",
     "ping: huggingface.co: Temporary failure in name resolution"),
    ("getent: hf.co: Nom ou service inconnu", "getent: hf.co: Name or service not known"),
    # prose that ends in the same words is no resolver line
    ("meine Frage ist: warum kommt: Temporärer Fehler bei der Namensauflösung",
     "meine Frage ist: warum kommt: Temporärer Fehler bei der Namensauflösung"),
])
def test_a_localized_resolver_line_reads_as_the_english_one(line, want):
    assert oswords.unlocalize(line) == want
