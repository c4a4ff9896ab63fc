"""The command line: one argparse tree with a lazy command table (as pip does).

`loradoctor --help` imports no command module; `loradoctor NAME ...` imports only NAME's module,
which builds its parser (`build_parser(name)`) and sets `func(options) -> exit code` on it. Every
error reaches the user the same way: `loradoctor: error: <one line>` on stderr, exit 2.

Exit codes, the same for every command:
  0  healthy / a diagnosis was made / done
  1  problems found (explain: nothing recognised; repro: a problem confirmed; estimate: does not fit)
  2  bad usage or unreadable input (one line on stderr)
  3  loradoctor itself failed (one line on stderr naming the file with the traceback)
A reader that goes away (`| head`) does not change the code; Ctrl-C exits 130.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

# name -> (module, one-line summary). The summaries are the root --help; modules load on use only.
COMMANDS: dict[str, tuple[str, str]] = {
    "env": ("loradoctor.cli.env_cmd",
            "check this machine: driver, CUDA, torch build, bf16, flash-attn, bitsandbytes, GPU memory"),
    "explain": ("loradoctor.cli.explain_cmd", "name the root cause of a failed run from its logs, with evidence and fixes"),
    "estimate": ("loradoctor.cli.estimate_cmd", "predict peak GPU memory of a LoRA / QLoRA / full fine-tuning run"),
    "preflight": ("loradoctor.cli.estimate_cmd", "quick env checks + the estimate on this GPU; put it before train.py"),
    "measure": ("loradoctor.cli.estimate_cmd", "measure a few real training steps on this GPU next to the estimate"),
    "repro": ("loradoctor.cli.repro_cmd", "small GPU tests that confirm a diagnosis: list | show ID | run ID..."),
    "rules": ("loradoctor.cli.rules_cmd", "the rule library behind explain: list | show ID | lint [DIR]"),
    "run": ("loradoctor.cli.run_cmd", "run a training command under watch: memory timeline, diagnosis on failure"),
    "recommend": ("loradoctor.cli.recommend_cmd", "the LoRA / QLoRA config to copy for a model on a card"),
    "lint": ("loradoctor.cli.lint_cmd", "a training config's pitfalls before launch, with file:line and the fix"),
    "gpus": ("loradoctor.cli.docs_cmd", "the GPU card table --gpu NAME is matched against: memory, compute capability, bf16"),
    "docs": ("loradoctor.cli.docs_cmd", "read the documentation shipped with loradoctor: docs [TOPIC]"),
    "completion": ("loradoctor.cli.completion_cmd", "print a shell completion script: completion bash|zsh|fish"),
}

EXIT_CODES = """exit codes (every command):
  0  healthy / a diagnosis was made / done
  1  problems found (explain: nothing recognised; repro: a problem confirmed; estimate: does not fit)
  2  bad usage or unreadable input (one line on stderr)
  3  loradoctor itself failed (one line on stderr naming the file with the full traceback)
  Output cut short by a closed pipe (| head) keeps the command's code; Ctrl-C exits 130."""

LAUNCH_SNIPPET = """set -o pipefail   # without it the pipeline's status is tee's, and explain never runs
loradoctor preflight --config train.yaml || exit 1
python train.py 2>&1 | tee run.log || { status=$?; loradoctor explain run.log --env live; exit $status; }"""


def root_help() -> str:
    from loradoctor import __version__

    width = max(len(n) for n in COMMANDS)
    table = "\n".join(f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items())
    return f"""usage: loradoctor [-h] [--version] COMMAND ...

The offline doctor for LoRA / QLoRA fine-tuning (loradoctor {__version__}). Nothing here uses the network.

commands:
{table}

examples:
  loradoctor env
  loradoctor explain crash.log
  loradoctor estimate --model meta-llama/Llama-3.1-8B --method qlora --gpu 'RTX 5090'
  loradoctor repro run bf16

a launch script (bash):
{_indent(LAUNCH_SNIPPET)}

`loradoctor COMMAND --help` shows a command's options; `loradoctor completion bash|zsh|fish` prints
a completion script.

{EXIT_CODES}
"""


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def build_command_parser(name: str):
    """The parser of one command (its module imported now)."""
    import importlib

    module = importlib.import_module(COMMANDS[name][0])
    return module.build_parser(name)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run loradoctor with `argv` (default sys.argv[1:]); returns the exit code (the console script exits with it)."""
    from loradoctor.errors import UserError, one_line

    from loradoctor import notes, redact

    args = list(sys.argv[1:] if argv is None else argv)
    # the one output hook: --format md (or --redact) sends every report line through loradoctor.redact
    args = redact.install(args)
    try:
        return _dispatch(args)
    except UserError as exc:
        print(f"loradoctor: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except SystemExit as exc:  # argparse's --help and --version
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except KeyboardInterrupt:
        print("loradoctor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        from loradoctor.render.output import stdout_closed

        stdout_closed()
        return 0
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected failure is turned into a line
        from loradoctor.errors import report_crash

        print(report_crash(exc, args), file=sys.stderr)
        return 3
    finally:
        redact.uninstall()
        notes.show(verbose=bool({"-v", "--verbose"} & set(args)))


STARTUP_GC_THRESHOLD = 50_000  # the young-generation threshold while a command starts (Python's default: 700)
_gc_saved: Optional[tuple] = None  # the thresholds entry() replaced, until startup_done()


def startup_done() -> None:
    """What a command calls once its start-up data is loaded: the objects that live as long as the process
    (modules, rules) move out of the collector's sight (gc.freeze: a long read then never walks them again)
    and the collector's usual thresholds come back."""
    global _gc_saved
    import gc

    if _gc_saved is not None:
        gc.freeze()
        gc.set_threshold(*_gc_saved)
        _gc_saved = None


def entry() -> None:
    """The console script (and `python -m loradoctor`): main(), then leave without the interpreter's
    teardown. Freeing every module and object one by one costs ~40 ms after a short `explain`, a
    quarter of its start-up budget; the operating system frees a process's memory at once. What
    teardown would do that matters is done here first: stdout and stderr are flushed and the atexit
    handlers run. With a thread of ours still running (none of our threads is non-daemon today) the
    normal exit is kept, so nothing is cut short."""
    import atexit
    import gc
    import os

    # start-up allocates tens of thousands of long-lived objects (modules, the rule library) and frees
    # few: collecting young objects every 700 allocations then costs ~10 ms for nothing. The command
    # calls startup_done() once its data is loaded (explain: after the rules), which restores the
    # thresholds; a command that never does keeps the higher one (cycles are still collected).
    global _gc_saved
    _gc_saved = gc.get_threshold()
    gc.set_threshold(STARTUP_GC_THRESHOLD, *_gc_saved[1:])
    code = main()
    threading = sys.modules.get("threading")  # not imported: no thread was started (importing it costs ~1 ms)
    if threading is not None and any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass  # a reader gone away keeps the code (see render/output.py)
    atexit._run_exitfuncs()  # e.g. coverage's data file; a public equivalent does not exist
    os._exit(code)


def _dispatch(args: list[str]) -> int:
    from loradoctor.errors import UserError
    from loradoctor.render.output import write_report

    if not args:
        write_report(root_help().rstrip("\n"))
        return 2
    first = args[0]
    if first in ("-h", "--help"):
        write_report(root_help().rstrip("\n"))
        return 0
    if first == "--version":
        from loradoctor import __version__

        write_report(f"loradoctor {__version__}")
        return 0
    if first not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(first, list(COMMANDS), n=1)
        what = "option" if first.startswith("-") else "command"
        hint = f"; did you mean {close[0]}?" if close else ""
        raise UserError(f"unknown {what} {first!r}{hint} (loradoctor --help lists the commands)")
    parser = build_command_parser(first)
    options = vars(parser.parse_args(args[1:]))
    func = options.pop("func", None)
    if func is None:  # a group (repro, rules) without its subcommand
        write_report(parser.format_help().rstrip("\n"))
        return 2
    return int(func(options) or 0)
