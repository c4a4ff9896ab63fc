"""Errors that reach the user as one line and exit code 2 (bad usage or unreadable input)."""


class UserError(Exception):
    """Bad usage or unreadable input. The CLI prints `loradoctor: error: <message>` and exits 2."""

    exit_code = 2
