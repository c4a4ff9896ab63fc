"""The command line: one small module per command family; each parses options, calls a core, renders.

Exit codes mean one thing each across commands: 0 healthy / diagnosis made, 1 problems found
(or nothing recognised, for explain), 2 the doctor could not run or bad usage.
"""

from __future__ import annotations

import sys

import typer

from loradoctor import __version__
from loradoctor.errors import UserError

app = typer.Typer(
    name="loradoctor",
    help=(
        "The offline doctor for LoRA / QLoRA fine-tuning.\n\n"
        "\b\n"
        "  loradoctor env                  check this machine: driver, CUDA, torch build, bf16,\n"
        "                                  flash-attn, bitsandbytes, GPU memory held by others\n"
        "  loradoctor explain crash.log    name the root cause of a crash, with evidence and fixes\n"
        "  loradoctor estimate --model meta-llama/Llama-3.1-8B --method qlora --gpu 'RTX 5090'\n"
        "  loradoctor preflight ...        env checks + estimate on this GPU; put it before train.py\n"
        "  loradoctor repro run bf16       confirm a diagnosis with a small GPU test\n\n"
        "Nothing here uses the network. Exit codes: 0 ok, 1 problems found, 2 bad usage or unreadable input."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_help_option=False,  # replaced by the bool --help below: typer coerces click's own flag through pydantic (slow import)
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"loradoctor {__version__}")
        raise typer.Exit(0)


def _help(ctx: typer.Context, value: bool) -> None:
    if value:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    help_: bool = typer.Option(False, "-h", "--help", callback=_help, is_eager=True, expose_value=False,
                               help="Show this message and exit."),
) -> None:
    pass


def _register() -> None:
    # Each module adds its commands to `app`; imports inside them stay lazy so startup stays fast.
    from loradoctor.cli import env_cmd, estimate_cmd, explain_cmd, lint_cmd, recommend_cmd, repro_cmd

    for module in (env_cmd, explain_cmd, estimate_cmd, repro_cmd, recommend_cmd, lint_cmd):
        module.register(app)


_register()


def main() -> None:
    try:
        app()
    except UserError as exc:
        print(f"loradoctor: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("loradoctor: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
