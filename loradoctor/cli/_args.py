"""What every command module shares: the argparse parser that reports bad usage the loradoctor way
(one line, exit 2), and small option checks.

A command module defines `build_parser(name)`: a parser whose `func` default (set_defaults) takes the
parsed options as a dict and returns the exit code. The root (loradoctor/cli/__init__.py) imports the
module only when its command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable, Optional

from loradoctor.errors import UserError


class Parser(argparse.ArgumentParser):
    """argparse that reports bad usage as one line and exit 2 (via UserError), never a usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.removeprefix("loradoctor").strip()
        raise UserError(f"{command}: {message} (loradoctor {command} --help)" if command else message)


class Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's raw-description formatter, told the terminal width (render.output.terminal_columns) so that
    it does not import shutil to learn it: argparse builds a formatter for every option it adds."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: Optional[int] = None) -> None:
        if width is None:
            from loradoctor.render.output import terminal_columns

            width = terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)


def new_parser(name: str, description: str, epilog: str = "",
               func: Optional[Callable[[dict[str, Any]], int]] = None) -> Parser:
    """An empty parser for `loradoctor NAME`; the description and epilog keep their line breaks."""
    p = Parser(prog=f"loradoctor {name}", description=description, epilog=epilog or None, allow_abbrev=False,
               formatter_class=Formatter)
    # Listed here for --help; main() takes them off the command line first (loradoctor.redact.install).
    p.add_argument("--redact", action="store_true", default=argparse.SUPPRESS,
                   help="replace secrets, e-mails, IPs, host and user names in the report (on for --format md)")
    p.add_argument("--no-redact", action="store_true", default=argparse.SUPPRESS,
                   help="print the report as it is, even with --format md")
    if func is not None:
        p.set_defaults(func=func)
    return p


def add_subcommands(parser: Parser) -> Any:
    """The subparsers of a group command (repro, rules); each subcommand sets its own `func`."""
    return parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=Parser)


def sub_parser(subs: Any, name: str, description: str, func: Callable[[dict[str, Any]], int]) -> Parser:
    p = subs.add_parser(name, help=description.split("\n")[0].rstrip("."), description=description,
                        allow_abbrev=False, formatter_class=Formatter)
    p.set_defaults(func=func)
    return p


def check_format(fmt: str, allowed: tuple[str, ...]) -> str:
    value = fmt.strip().lower()
    if value not in allowed:
        raise UserError(f"--format {fmt!r}: use one of {', '.join(allowed)}")
    return value


def check_rule_dir(path: Path, option: str) -> str:
    if not path.exists():
        raise UserError(f"{option} {path}: no such folder")
    if not path.is_dir():
        raise UserError(f"{option} {path}: not a folder (give the folder that holds your rule .yaml files)")
    return str(path)


def format_option(parser: Parser, choices: tuple[str, ...]) -> None:
    """`-f/--format` with the given choices (the first is the default)."""
    parser.add_argument("-f", "--format", dest="fmt", default=choices[0], metavar="FMT",
                        help=" | ".join(choices) + f" (default {choices[0]})")
