"""A small on-disk cache for results that are slow to make and cheap to key: the torch probe of
`loradoctor env` (a child `import torch`, ~2 s), the parsed built-in rule library of `explain` and
the data files it reads (the cause catalogue, the differential and frame tables: `yaml_data`).

Where: $LORADOCTOR_CACHE_DIR, else $XDG_CACHE_HOME/loradoctor, else ~/.cache/loradoctor.
LORADOCTOR_NO_CACHE=1 turns it off. A cache that cannot be read or written is simply not used:
it never makes a command fail. Entries are written atomically (temp file + rename), so two
loradoctor processes at once (one per rank) cannot see half a file.

The cache must never be a way for another local user to feed us data (the rule cache is a pickle):
the folder is created 0700 and used only when it is a real folder (not a symlink) owned by the
current user and not writable by group or others, inside a parent that another user cannot swap
it out of; it is opened once and entries are opened relative to it, without following links and
without blocking (a FIFO planted as an entry), and read only when they are regular files owned by
the user and at most MAX_ENTRY_BYTES. Entry names carry the user id. Anything else is ignored, with a
one-line note shown under -v (loradoctor.notes).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Iterable, Optional

from loradoctor import notes

try:  # the interpreter's own SHA-256: importing hashlib loads OpenSSL (~3 ms of every start)
    from _sha2 import sha256 as _sha256  # type: ignore[import-not-found]  # Python 3.12+
except ImportError:
    try:
        from _sha256 import sha256 as _sha256  # type: ignore[import-not-found,no-redef]
    except ImportError:  # pragma: no cover - a build without the builtin module
        from hashlib import sha256 as _sha256  # type: ignore[no-redef]

MAX_ENTRY_BYTES = 32 << 20  # the rule library is ~0.5 MB; a probe result a few kB

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


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
    h = _sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, default=str).encode("utf-8", "replace"))
        h.update(b"\0")
    return h.hexdigest()[:32]


def _uid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else 0


def entry_name(kind: str, key: str, suffix: str) -> str:
    """The file name of an entry: the user id is part of it, so two users never share an entry."""
    return f"{kind}-u{_uid()}-{key}{suffix}"


def path_for(kind: str, key: str, suffix: str) -> Path:
    return cache_dir() / entry_name(kind, key, suffix)


def _skip(folder: Path, why: str) -> None:
    notes.add(f"cache: not using {folder}: {why}")


def _parent_ok(folder: Path) -> bool:
    """False when the folder sits in a parent that another user could replace it in: a parent owned by
    someone else (not root) that others can write, or a world-writable parent without the sticky bit."""
    parent = folder.parent
    while True:  # a parent that does not exist yet will be ours: judge the nearest one that does
        try:
            st = os.stat(parent)
            break
        except FileNotFoundError:
            if parent.parent == parent:
                return False
            parent = parent.parent
        except OSError:
            return False
    writable_by_others = st.st_mode & 0o022
    if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
        return False
    return not (writable_by_others and st.st_uid not in (_uid(), 0))


def _open_dir(create: bool) -> Optional[int]:
    """A descriptor of the cache folder when it is safe to use (see the module doc), else None."""
    if not enabled() or not _NOFOLLOW or not hasattr(os, "geteuid"):
        return None  # no O_NOFOLLOW or no user ids (Windows): no cache rather than an unsafe one
    try:
        folder = cache_dir()
    except OSError:
        return None
    if not _parent_ok(folder):
        if folder.parent.exists():
            _skip(folder, "its parent folder can be changed by another user")
        return None
    if create:
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
    try:
        fd = os.open(folder, os.O_RDONLY | _DIRECTORY | _NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        _skip(folder, "a symlink or not a folder" if exc.errno in (20, 40) else (exc.strerror or str(exc)))
        return None
    try:
        st = os.fstat(fd)
        why = None
        if not stat.S_ISDIR(st.st_mode):
            why = "not a folder"
        elif st.st_uid != _uid():
            why = f"owned by user id {st.st_uid}, not by you ({_uid()})"
        elif st.st_mode & 0o022:
            why = f"writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
        if why is not None:
            _skip(folder, why)
            os.close(fd)
            return None
        if st.st_mode & 0o077:
            try:
                os.fchmod(fd, 0o700)  # an older loradoctor created it 0755: entries need not be readable by others
            except OSError:
                pass
        return fd
    except OSError:
        os.close(fd)
        return None


def read_bytes(kind: str, key: str, suffix: str) -> Optional[bytes]:
    """The entry's bytes when the folder and the entry pass the checks (module doc), else None."""
    dir_fd = _open_dir(create=False)
    if dir_fd is None:
        return None
    name = entry_name(kind, key, suffix)
    try:
        try:
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            notes.add(f"cache: ignoring entry {name}: {exc.strerror or exc}")
            return None
        try:
            st = os.fstat(fd)
            why = None
            if not stat.S_ISREG(st.st_mode):
                why = "not a regular file"
            elif st.st_uid != _uid():
                why = f"owned by user id {st.st_uid}"
            elif st.st_size > MAX_ENTRY_BYTES:
                why = f"larger than {MAX_ENTRY_BYTES >> 20} MiB"
            if why is not None:
                notes.add(f"cache: ignoring entry {name}: {why}")
                return None
            chunks, total = [], 0
            while total <= MAX_ENTRY_BYTES:
                chunk = os.read(fd, min(1 << 20, MAX_ENTRY_BYTES + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            if total > MAX_ENTRY_BYTES:  # it grew while we read it
                return None
            return b"".join(chunks)
        finally:
            os.close(fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)


def write_bytes(kind: str, key: str, suffix: str, data: bytes, keep: int = 8) -> bool:
    """Store an entry; keep at most `keep` entries of this kind (the oldest go). False when it could not."""
    if len(data) > MAX_ENTRY_BYTES:
        return False
    dir_fd = _open_dir(create=True)
    if dir_fd is None:
        return False
    name = entry_name(kind, key, suffix)
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
            raise
        _prune(dir_fd, f"{kind}-u{_uid()}-", suffix, keep)
        return True
    except OSError:
        return False
    finally:
        os.close(dir_fd)


def read_json(kind: str, key: str) -> Optional[Any]:
    data = read_bytes(kind, key, ".json")
    if data is None:
        return None
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def write_json(kind: str, key: str, value: Any, sort_keys: bool = True) -> bool:
    return write_bytes(kind, key, ".json", json.dumps(value, sort_keys=sort_keys, default=str).encode("utf-8"))


def yaml_data(path: Path, kind: str) -> dict:
    """A YAML data file shipped with loradoctor (a mapping at the top), parsed and kept here as plain
    JSON (never a pickle) while the file is unchanged: reading the JSON back costs a millisecond,
    importing and running the YAML parser 10-40 ms of a command's start. Only data that JSON gives
    back unchanged is kept; an entry that is not a mapping is ignored and the file parsed again. The JSON
    keeps the file's order of keys (the catalogue's order is the docs page's and `rules list`'s): a cached
    read gives what a fresh parse gives."""
    from loradoctor import __version__

    try:
        st = path.stat()
        # ("file order": entries written before it had their keys sorted)
        key: Optional[str] = digest([__version__, "file order", str(path), st.st_size, st.st_mtime_ns])
    except OSError:
        key = None
    if key is not None:
        data = read_json(kind, key)
        if isinstance(data, dict):
            return data
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader) or {}
    if key is not None and isinstance(data, dict):
        try:
            plain = json.loads(json.dumps(data)) == data
        except (TypeError, ValueError):
            plain = False
        if plain:
            write_json(kind, key, data, sort_keys=False)
    return data


def _prune(dir_fd: int, prefix: str, suffix: str, keep: int) -> None:
    entries = []
    try:
        with os.scandir(dir_fd) as it:
            for e in it:
                if e.name.startswith(prefix) and e.name.endswith(suffix):
                    try:
                        entries.append((e.stat(follow_symlinks=False).st_mtime_ns, e.name))
                    except OSError:
                        continue
    except OSError:
        return
    for _, name in sorted(entries, reverse=True)[keep:]:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass
