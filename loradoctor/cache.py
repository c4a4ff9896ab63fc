"""A small on-disk cache for results that are slow to make and cheap to key: the torch probe of
`loradoctor env` (a child `import torch`, ~2 s) and the parsed built-in rule library of `explain`.

Where: $LORADOCTOR_CACHE_DIR, else $XDG_CACHE_HOME/loradoctor, else ~/.cache/loradoctor.
LORADOCTOR_NO_CACHE=1 turns it off. A cache that cannot be read or written is simply not used:
it never makes a command fail. Entries are written atomically (temp file + rename), so two
loradoctor processes at once (one per rank) cannot see half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Optional


def enabled() -> bool:
    return os.environ.get("LORADOCTOR_NO_CACHE", "").strip().lower() not in ("1", "true", "yes", "on")


def cache_dir() -> Path:
    """The cache folder (it may not exist yet). Raises OSError when no home folder can be found."""
    try:
        explicit = os.environ.get("LORADOCTOR_CACHE_DIR")
        if explicit:
            return Path(explicit).expanduser()
        xdg = os.environ.get("XDG_CACHE_HOME")
        return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "loradoctor"
    except (RuntimeError, KeyError) as exc:  # no HOME and no passwd entry (some containers)
        raise OSError(f"no cache folder: {exc}") from None


def digest(parts: Iterable[Any]) -> str:
    """A short stable hash of anything JSON can write (the key of an entry)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, default=str).encode("utf-8", "replace"))
        h.update(b"\0")
    return h.hexdigest()[:32]


def path_for(kind: str, key: str, suffix: str) -> Path:
    return cache_dir() / f"{kind}-{key}{suffix}"


def read_bytes(kind: str, key: str, suffix: str) -> Optional[bytes]:
    if not enabled():
        return None
    try:
        return path_for(kind, key, suffix).read_bytes()
    except OSError:
        return None


def write_bytes(kind: str, key: str, suffix: str, data: bytes, keep: int = 8) -> bool:
    """Store an entry; keep at most `keep` entries of this kind (the oldest go). False when it could not."""
    if not enabled():
        return False
    try:
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{kind}-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path_for(kind, key, suffix))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        _prune(folder, kind, suffix, keep)
        return True
    except OSError:
        return False


def read_json(kind: str, key: str) -> Optional[Any]:
    data = read_bytes(kind, key, ".json")
    if data is None:
        return None
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None


def write_json(kind: str, key: str, value: Any) -> bool:
    return write_bytes(kind, key, ".json", json.dumps(value, sort_keys=True, default=str).encode("utf-8"))


def _prune(folder: Path, kind: str, suffix: str, keep: int) -> None:
    entries = []
    for p in folder.glob(f"{kind}-*{suffix}"):
        try:
            entries.append((p.stat().st_mtime_ns, p))
        except OSError:
            continue
    for _, p in sorted(entries, reverse=True)[keep:]:
        try:
            p.unlink()
        except OSError:
            pass
