"""Placeholder: this command family is being built (see the open issues)."""

import typer


def register(app: typer.Typer) -> None:
    pass
