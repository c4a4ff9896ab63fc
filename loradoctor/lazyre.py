"""Module-level regexes compiled on first use.

The log modules hold ~150 regexes; compiling them all at import was a third of the start-up of
`explain` on a short log, most of them for extractors the log never triggers. `lazy_re(pattern,
flags)` stands in for `re.compile(pattern, flags)` at module level: `.pattern` is there at once,
and the first use of anything else (`search`, `match`, `flags`, ...) compiles the pattern and
keeps the compiled object's bound methods on the instance, so later calls cost what a compiled
pattern's calls cost (one attribute lookup). `is_pattern(v)` is True for both kinds."""

from __future__ import annotations

import re
from typing import Any, Union

# what a compiled pattern offers; all are copied onto the instance on first use
_ATTRS = ("search", "match", "fullmatch", "finditer", "findall", "sub", "subn", "split", "scanner", "flags",
          "groups", "groupindex")


class LazyPattern:
    """re.compile(pattern, flags), deferred to the first use of anything but `.pattern`."""

    def __init__(self, pattern: Union[str, bytes], flags: int = 0) -> None:
        self.pattern = pattern
        self._flags = flags

    def compiled(self) -> re.Pattern:
        """The compiled pattern (compiled now if it was not yet)."""
        found = self.__dict__.get("_compiled")
        if found is None:
            found = re.compile(self.pattern, self._flags)
            self.__dict__["_compiled"] = found
            for name in _ATTRS:
                self.__dict__[name] = getattr(found, name)
        return found

    def __getattr__(self, name: str) -> Any:  # only called for names not on the instance yet
        if name.startswith("__") or name in ("_compiled", "pattern", "_flags"):
            raise AttributeError(name)
        return getattr(self.compiled(), name)

    def __repr__(self) -> str:
        return f"lazy_re({self.pattern!r}, {self._flags!r})"


def lazy_re(pattern: Union[str, bytes], flags: int = 0) -> LazyPattern:
    return LazyPattern(pattern, flags)


def is_pattern(value: Any) -> bool:
    """A compiled regex or a lazy one."""
    return isinstance(value, (re.Pattern, LazyPattern))
