"""Commands whose options argparse parses, mounted under the typer root.

typer coerces each typed option through pydantic, and importing it (with typer's adapters) costs
about 0.3 s, more than the rest of a `loradoctor env` that hits its probe cache. The commands people
run on every launch (env, explain, estimate, preflight) therefore take their options with argparse:
the root app only dispatches to them and lists them in `loradoctor --help`.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import typer

from loradoctor.errors import UserError


class Parser(argparse.ArgumentParser):
    """argparse that reports bad usage the loradoctor way: one line, exit 2 (via UserError)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message}")


def new_parser(name: str, description: str, epilog: str = "") -> Parser:
    """An empty parser for `loradoctor NAME`; the description and epilog keep their line breaks."""
    parser = Parser(prog=f"loradoctor {name}", description=description, epilog=epilog or None, allow_abbrev=False,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    # Listed here for --help; the CLI's main takes them off the command line first (loradoctor.redact.install).
    parser.add_argument("--redact", action="store_true", default=argparse.SUPPRESS,
                        help="replace secrets, e-mails, IPs, host and user names in the report (on for --format md)")
    parser.add_argument("--no-redact", action="store_true", default=argparse.SUPPRESS,
                        help="print the report as it is, even with --format md")
    return parser


def mount(app: typer.Typer, name: str, summary: str, make_parser: Callable[[], argparse.ArgumentParser],
          body: Callable[[dict[str, Any]], int], help_when_empty: bool = False) -> None:
    """Add `loradoctor NAME` to the root app: typer passes every argument through untouched, argparse
    parses them (its --help included), `body(options)` runs and returns the exit code.
    `help_when_empty`: no argument at all prints the help and exits 2 (a command that needs input)."""
    settings = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}

    @app.command(name, help=summary, context_settings=settings, add_help_option=False)
    def _cmd(ctx: typer.Context) -> None:
        parser = make_parser()
        if help_when_empty and not ctx.args:
            parser.print_help()
            raise typer.Exit(2)
        options = vars(parser.parse_args(list(ctx.args)))
        options.pop("redact", None)
        options.pop("no_redact", None)
        code = body(options)
        raise typer.Exit(code or 0)
