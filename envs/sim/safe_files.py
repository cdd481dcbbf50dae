"""Bounded reading of files pdgym did not write itself in this process: traces, cost tables, and what a run folder
holds (checkpoints, agent.json, their zip members, config.yaml, the CSV logs, metrics files); and the one way
pdgym writes into a folder (`atomic_path`, `open_nofollow`, `make_dir`), never through a link planted there.

A reader checks before reading a byte that the path is a regular file (not a device like /dev/zero, a FIFO or a
folder), optionally that it resolves inside a given folder (no symlink out of a run folder), and that its size
is within a stated bound; each refusal is one ConfigError line naming what the file is for. The bounds every
reader uses are listed in docs/architecture.md ("Files pdgym reads, and their bounds"). JSON, YAML and CSV are
parsed here too (YAML without aliases, no value nested deeper than the parser's recursion allows), and `get_key`
reads a stored document's key by key: a missing or mistyped key is one line naming the file and the key.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from pathlib import Path

from .validation import ConfigError

MiB = 1 << 20
GiB = 1 << 30
GZIP_MAGIC = b"\x1f\x8b"


MAX_JSON_DEPTH = 64  # the deepest JSON pdgym writes nests a few levels (a trace event, a board summary)


def _size(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB" if n >= MiB else f"{n} bytes"


def check_regular_file(path: str | os.PathLike, max_bytes: int, what: str,
                       within: str | os.PathLike | None = None) -> Path:
    """`path` if it is a regular file of at most `max_bytes` (resolving inside the folder `within`, when given);
    else a one-line ConfigError starting with `what` (e.g. "cost.params.path", "checkpoint"). Reads nothing."""
    p = Path(path)
    try:
        st = os.stat(p)  # follows a symlink: the target is what would be read
    except FileNotFoundError:
        raise ConfigError(f"{what}: file not found: {p}") from None
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {p}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a device, pipe or socket"
        raise ConfigError(f"{what}: {p} is {kind}, not a regular file")
    if within is not None:
        root, real = Path(within).resolve(), p.resolve()
        if real != root and root not in real.parents:
            raise ConfigError(f"{what}: {p} leads outside {root} (a symbolic link to {real}); refused")
    if st.st_size > max_bytes:
        raise ConfigError(f"{what}: {p} is {_size(st.st_size)}, more than the {_size(max_bytes)} this reader accepts")
    return p


def read_bytes(path: str | os.PathLike, max_bytes: int, what: str, within: str | os.PathLike | None = None) -> bytes:
    """The bytes of a checked file (`check_regular_file`), at most `max_bytes` even if it grows meanwhile."""
    p = check_regular_file(path, max_bytes, what, within)
    try:
        with open(p, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {p}: {exc.strerror}") from None
    if len(data) > max_bytes:
        raise ConfigError(f"{what}: {p} grew beyond {_size(max_bytes)} while being read")
    return data


def read_text(path: str | os.PathLike, max_bytes: int, what: str, within: str | os.PathLike | None = None) -> str:
    """A checked file's text, which must be UTF-8 (a gzip file or another encoding is one line, not a traceback)."""
    data = read_bytes(path, max_bytes, what, within)
    if data.startswith(GZIP_MAGIC):
        raise ConfigError(f"{what}: {path} is gzip-compressed; give the uncompressed text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what}: {path} is not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})") \
            from None


def read_json(path: str | os.PathLike, max_bytes: int, what: str, within: str | os.PathLike | None = None):
    """A checked file's JSON value (`read_text`, then parsed; malformed JSON is one line, not a traceback)."""
    return parse_json(read_text(path, max_bytes, what, within), what, path)


def json_depth(text: str | bytes) -> int:
    """An upper bound of how deep `text`'s brackets nest, at C speed without parsing (brackets inside strings
    count too: pdgym's files have none): json.loads recurses once a level, so a line nested 200,000 deep would
    raise RecursionError, and one nested a few hundred deep would reach recursive code after it."""
    import numpy as np

    b = np.frombuffer(text.encode("utf-8", "replace") if isinstance(text, str) else text, dtype=np.uint8)
    brackets = b[(b == 91) | (b == 123) | (b == 93) | (b == 125)]  # [ { ] }
    if not len(brackets):
        return 0
    return int(np.cumsum(np.where((brackets == 91) | (brackets == 123), 1, -1)).max())


def too_deep(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """`text` nests deeper than `max_depth` (`json_depth`, skipped when it has too few brackets to)."""
    o, c = ("[", "{") if isinstance(text, str) else (b"[", b"{")
    return text.count(o) + text.count(c) > max_depth and json_depth(text) > max_depth


def parse_json(text: str, what: str, path: str | os.PathLike | None = None, max_depth: int = MAX_JSON_DEPTH):
    """`text`'s JSON value, nested at most `max_depth` deep; else one ConfigError line starting with `what`."""
    where = f" {path}" if path is not None else ""
    if too_deep(text, max_depth):
        raise ConfigError(f"{what}:{where} nests its values too deeply (more than {max_depth} levels; pdgym's files "
                          "nest a few)")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{what}:{where} is not valid JSON ({str(exc).splitlines()[0][:120]})") from None
    except RecursionError:
        raise ConfigError(f"{what}:{where} nests its values too deeply to be a file pdgym wrote") from None


def _no_alias_loader():
    import yaml

    class Loader(yaml.SafeLoader):
        """yaml's safe loader (plain data only) that also refuses aliases: pdgym writes none, and a few nested
        aliases make a small file a structure too large to compare or print."""

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise yaml.composer.ComposerError(None, None, "an alias (*name); pdgym writes none",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)

    return Loader


def read_yaml(path: str | os.PathLike, max_bytes: int, what: str, within: str | os.PathLike | None = None):
    """A checked file's YAML value as plain Python data (`read_text`, then yaml's safe loader without aliases:
    no tag builds an object; malformed YAML is one line, not a traceback)."""
    import yaml

    text = read_text(path, max_bytes, what, within)
    try:
        return yaml.load(text, Loader=_no_alias_loader())  # noqa: S506 -- a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what}: {path} is not valid YAML ({' '.join(str(exc).split())[:160]})") from None
    except RecursionError:
        raise ConfigError(f"{what}: {path} nests its values too deeply to be a file pdgym wrote") from None


def read_csv(path: str | os.PathLike, max_bytes: int, what: str, within: str | os.PathLike | None = None):
    """A checked file's CSV table as a pandas DataFrame (`read_text`, then pandas; a malformed or empty table is
    one line, not a traceback)."""
    import io

    import pandas as pd

    text = read_text(path, max_bytes, what, within)
    try:
        return pd.read_csv(io.StringIO(text))
    except pd.errors.EmptyDataError:
        raise ConfigError(f"{what}: {path} is empty (no CSV header)") from None
    except (pd.errors.ParserError, ValueError) as exc:
        raise ConfigError(f"{what}: {path} is not a valid CSV table ({' '.join(str(exc).split())[:160]})") from None


_REQUIRED = object()


def get_key(doc, key: str, kind: type | tuple[type, ...], what: str, path: str | os.PathLike, default=_REQUIRED):
    """`doc[a][b]...` for the dotted `key` of a stored document (JSON, YAML) when it is of `kind` (bool is not an
    int here); `default` when given and a mapping on the way lacks the key; else one ConfigError line naming the
    file and the key ("runs: RUN/config.yaml has no eval.split")."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    node = doc
    for i, part in enumerate(key.split(".")):
        if isinstance(node, dict) and part not in node and default is not _REQUIRED:
            return default
        if not isinstance(node, dict) or part not in node:
            where = ".".join(key.split(".")[:i]) or "its top level"
            got = "" if isinstance(node, dict) else f" ({where} is a {type(node).__name__}, not a mapping)"
            raise ConfigError(f"{what}: {path} has no {key}{got}")
        node = node[part]
    if not isinstance(node, kinds) or (isinstance(node, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise ConfigError(f"{what}: {path} has {key} = {str(node)[:60]!r}, a {type(node).__name__}; expected {names}")
    return node


def check_zip_member(info, max_bytes: int, what: str) -> None:
    """A zip member's declared uncompressed size within `max_bytes`, checked before it is read (zipfile also stops
    reading a member at its declared size, so a lying header cannot make it read more)."""
    if info.file_size > max_bytes:
        raise ConfigError(f"{what}: member {info.filename} is {_size(info.file_size)}, more than the "
                          f"{_size(max_bytes)} this reader accepts")


# --------------------------------------------------------------------------- writing
def _default_mode() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


FILE_MODE = _default_mode()  # what open() would give a new file under this process's umask
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a fresh temporary sibling of `path` to write, renamed onto `path` only if the block completes.

    The temporary is created here with O_EXCL under an unpredictable name (tempfile.mkstemp, in the same folder,
    keeping the suffix: savefig reads it), so no link planted in the folder can receive the bytes; the rename
    replaces whatever `path` is (a link there is replaced, never followed). A folder at `path` is one line."""
    path = Path(path)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".partial{path.suffix}", dir=path.parent)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write into {path.parent}: {exc.strerror}") from None
    tmp = Path(name)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    try:
        yield tmp
        try:
            os.replace(tmp, path)
        except OSError as exc:
            if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise ConfigError(f"{path} is a folder; pdgym writes a file of that name there (move the folder "
                                  "away, or write the run elsewhere)") from None
            raise
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """`text` to `path` atomically (`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def open_nofollow(path: str | os.PathLike, flags: int = os.O_WRONLY | os.O_APPEND | os.O_CREAT, what: str = ""):
    """A descriptor of the regular file `path` opened with `flags` and O_NOFOLLOW (for a file written in place: a
    log appended to): a link there, a device, a pipe or a folder is one ConfigError line, never written."""
    p = Path(path)
    label = what or str(p)
    try:
        fd = os.open(p, flags | _NOFOLLOW | os.O_NONBLOCK, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{label}: {p} is a symbolic link; pdgym writes it in place and never through a link "
                              "(remove the link)") from None
        raise ConfigError(f"{label}: cannot write {p}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{label}: {p} is not a regular file (a device or a pipe); pdgym writes a plain file there")
    os.set_blocking(fd, True)
    return fd


def make_dir(path: str | os.PathLike, what: str = "") -> Path:
    """The folder `path` (created if new; its parent must exist), refused in one line when it is a symbolic link or
    not a folder: pdgym would write into whatever the link names."""
    p = Path(path)
    try:
        os.mkdir(p)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(f"{what or p}: cannot create the folder {p}: {exc.strerror}") from None
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{what or p}: {p} is a symbolic link; pdgym writes into a folder of its own there and "
                          "never through a link (remove the link)")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what or p}: {p} exists and is not a folder; pdgym writes a folder of that name there")
    return p


def save_figure(fig, path: str | os.PathLike, **kwargs) -> Path:
    """A matplotlib figure saved to `path` atomically (`atomic_path`; the format from `path`'s suffix)."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, **kwargs)
    return Path(path)


def fresh_dir(parent: str | os.PathLike, name: str) -> Path:
    """A new, empty temporary folder `.NAME.XXXXXX.partial` in `parent` (mkdtemp: an unpredictable name no planted
    link can stand at), with the permissions mkdir would give it; fill it, then rename it whole into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=parent))
    os.chmod(tmp, FILE_MODE | ((FILE_MODE & 0o444) >> 2))  # rw -> rwx where readable: 0644 -> 0755
    return tmp
