"""The one owner of run folders: every app writes its results into a folder claimed here.

A folder is claimed only if it is new, empty, or recognisably pdgym's own (it holds the marker file
`.pdgym-run`, written when pdgym creates or first uses it). A claim refuses, in one line (a ConfigError
naming the key the folder came from): an empty path, the filesystem root, the working directory or a folder
above it, system folders (/proc, /sys, /dev), an existing file, a folder under a file, a folder pdgym may not
write, a new top-level folder at the filesystem root (an empty path variable: `out_dir=` made /hydra/...), a
folder an app's own naming template puts outside that app's root (`name=../../escape`), and a folder another
pdgym process holds: the marker is also the lock (an exclusive `flock`, released by the kernel when the
holder exits, however it exits). Nothing is ever deleted or moved that the claim did not create: `discard()`
removes the entries this run added (the whole folder, and the parents it made, if it made them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import time
from pathlib import Path

from pdgym.envs.sim import safe_files
from pdgym.envs.sim.config import ConfigError

try:  # POSIX; elsewhere folders are still checked, not locked
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

MARKER = ".pdgym-run"
SYSTEM_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))
_HELD: dict[Path, RunFolder] = {}  # folders this process holds: a claim of one of them is re-entrant


def _resolved(path: str | os.PathLike) -> Path:
    return Path(os.path.abspath(Path(path).expanduser())).resolve()


def _deepest_existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if os.path.lexists(p):
            return p
    return Path("/")


def is_ours(path: str | os.PathLike) -> bool:
    """True when `path` is a folder carrying pdgym's marker."""
    p = Path(path)
    return p.is_dir() and not p.is_symlink() and (p / MARKER).is_file()


def check(path: str | os.PathLike, key: str) -> Path:
    """The resolved folder `path` if pdgym may write a run into it, else a ConfigError naming `key`. Writes nothing."""
    text = str(path).strip() if path is not None else ""
    if not text:
        raise ConfigError(f"{key}: empty; give the folder for the run")
    p = _resolved(text)
    cwd = Path.cwd().resolve()
    if p == Path(p.anchor):
        raise ConfigError(f"{key}: {text!r} is the filesystem root; give a folder of its own for the run")
    if p == cwd or p in cwd.parents:
        raise ConfigError(f"{key}: {text!r} is the working directory or a folder above it; give a folder of its own")
    if any(p == r or r in p.parents for r in SYSTEM_ROOTS):
        raise ConfigError(f"{key}: {text!r} is a system folder ({p}); give a folder of your own")
    if os.path.lexists(p):
        if not p.is_dir():
            raise ConfigError(f"{key}: {text!r} is an existing file, not a folder; pdgym neither moves nor "
                              "overwrites it: give a new folder")
        try:
            entries = os.listdir(p)
        except OSError as exc:
            raise ConfigError(f"{key}: cannot read the folder {text!r}: {exc.strerror}") from None
        if entries and MARKER not in entries:
            raise ConfigError(f"{key}: {text!r} is an existing folder that is not a pdgym run folder (no {MARKER} "
                              f"marker): give a new or empty folder (a run of an older pdgym: `touch {p / MARKER}` "
                              "adopts it)")
        if not os.access(p, os.W_OK | os.X_OK):
            raise ConfigError(f"{key}: {text!r} is read-only; give a folder pdgym may write")
        return p
    base = _deepest_existing(p)
    if not base.is_dir():
        raise ConfigError(f"{key}: {text!r} is under a file ({base}), not a folder; give a new folder")
    if base == Path(base.anchor):
        top = p.parts[1] if len(p.parts) > 1 else ""
        raise ConfigError(f"{key}: {text!r} would create the folder {base / top} at the filesystem root "
                          "(an empty path value?); give a folder under an existing one")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: {text!r} cannot be created: {base} is read-only; give a folder pdgym may write")
    return p


# --------------------------------------------------------------------------- an app's naming template
def _template_parts(template: str) -> list[str]:
    """`template` split at the '/' outside `${...}` interpolations."""
    parts, cur, depth = [], "", 0
    for ch in template:
        depth += (ch == "{" and cur.endswith("$")) - (ch == "}" and depth > 0)
        if ch == "/" and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [*parts, cur]


def template_keys(template: str) -> list[str]:
    """The plain config keys a folder template interpolates (`${name}`, `${out_dir}`; not resolvers like now:)."""
    return re.findall(r"\$\{([A-Za-z_][\w.]*)\}", template)


def check_templated(path: str | os.PathLike, template: str, key: str, values: dict) -> None:
    """A folder an app's template (`runs/train/${now:%Y-%m-%d}/${name}`) named: every config key it uses
    (`values`: key -> value) is a non-empty string or number, and the folder lies inside the template's literal
    root (runs/train), exactly as many levels down as the template says: a value with '/' or '..' in it, or an
    empty one, would write elsewhere (runs/escape, or runs/train/<date>/ itself)."""
    for k in template_keys(template):
        v = values.get(k)
        if v is None or isinstance(v, bool) or (isinstance(v, str) and not v.strip()):
            raise ConfigError(f"{k}: {'empty' if v in ('', None) else repr(v)}; it names the run folder "
                              f"({key}: {template})")
    parts = [p for p in _template_parts(template) if p not in ("", ".")]
    literal = []
    for part in parts:
        if "${" in part or part == "..":
            break
        literal.append(part)
    if not literal or len(literal) == len(parts):
        return
    root, p = _resolved(Path(*literal)), _resolved(path)
    depth = len(parts) - len(literal)
    if root not in p.parents or len(p.relative_to(root).parts) != depth:
        named = ", ".join(f"{k}={values.get(k)!r}" for k in template_keys(template)) or "its values"
        raise ConfigError(f"{named}: the run folder {p} would not be a folder of its own under {root} "
                          f"({key}: {template}); use letters, digits, '_', '-', '.' (no '/', no '..')")


# --------------------------------------------------------------------------- claiming
class RunFolder:
    """A claimed run folder: locked until `release()`; `discard()` removes what this claim added."""

    def __init__(self, path: Path, made: list[Path], before: set[str], fd: int | None):
        self.path, self.made, self.before, self.fd, self.count = path, made, before, fd, 1

    def added(self) -> list[Path]:
        """Entries of the folder this run added (all of it when it made the folder)."""
        if not self.path.is_dir():
            return []
        return [self.path / e for e in sorted(os.listdir(self.path)) if e not in self.before]

    def bare(self) -> bool:
        """Holds nothing this run added beyond the marker, Hydra's .hydra/ and log files."""
        return all(p.name in (MARKER, ".hydra") or p.suffix == ".log" for p in self.added())

    def discard(self) -> None:
        """Remove what this claim added: the folder and the parents it made, or only the entries it added."""
        if self.made:
            shutil.rmtree(self.path, ignore_errors=True)
            for d in self.made[1:]:
                try:
                    d.rmdir()
                except OSError:
                    break
        else:
            for p in self.added():
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
        self.release(force=True)

    def release(self, force: bool = False) -> None:
        self.count = 0 if force else self.count - 1
        if self.count > 0:
            return
        _HELD.pop(self.path, None)
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        self.release()


MAX_MARKER_BYTES = 4096  # the marker's JSON ({app, pid}): a few dozen bytes


def _holder(marker: Path) -> str:
    """Who holds the folder, from its marker (read bounded: a marker that is a device or a huge file is not read)."""
    try:
        info = safe_files.read_json(marker, MAX_MARKER_BYTES, "marker", within=marker.parent)
        return f"{str(info['app'])[:40]}, pid {int(info['pid'])}"
    except (ConfigError, KeyError, TypeError, ValueError, OverflowError):
        return "another pdgym process"


def _owner(fd: int) -> str | None:
    """The app an existing marker names (the app that made the folder), or None (a new or empty marker, one
    `touch` made to adopt an older run, or one that does not parse: the folder is adopted by whoever claims it)."""
    try:
        data = os.pread(fd, MAX_MARKER_BYTES, 0)
        info = safe_files.parse_json(data.decode("utf-8"), "marker") if data.strip() else None
    except (ConfigError, UnicodeDecodeError, OSError):
        return None
    app = info.get("app") if isinstance(info, dict) else None
    return app[:40] if isinstance(app, str) and app and app != "pdgym" else None


# What pdgym writes as files in a run folder is named with one of these suffixes, and it makes no folder so named:
# a folder there (steps.csv/) is refused when a Hydra run's folder is claimed, before a run whose write would fail on it.
FILE_SUFFIXES = (".json", ".csv", ".parquet", ".png", ".zip", ".yaml", ".html", ".md", ".txt", ".gif")


def folders_at_file_names(path: Path) -> list[str]:
    """Entries of the folder `path` that are folders (not links) named like a file pdgym writes (`FILE_SUFFIXES`)."""
    return [e.name for e in sorted(os.scandir(path), key=lambda e: e.name)
            if e.name.endswith(FILE_SUFFIXES) and e.is_dir(follow_symlinks=False)]


def _not_yours(key: str, path: Path, owner: str, app: str) -> str:
    return (f"{key}: {path} is a {owner} run folder; {app} writes its results into a folder of its own (its files "
            f"would replace {owner}'s): give another folder")


def check_owner(path: str | os.PathLike, key: str, app: str) -> None:
    """A ConfigError naming `key` when `path` is a run folder another app made (its marker names that app); a
    folder that is not pdgym's, or whose marker names no app, passes (`claim` and `is_ours` judge those)."""
    p = Path(path)
    if not is_ours(p):
        return
    try:
        fd = os.open(p / MARKER, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return
    try:
        owner = _owner(fd) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)
    if owner is not None and owner != app:
        raise ConfigError(_not_yours(key, p, owner, app))


def claim(path: str | os.PathLike, key: str, app: str = "pdgym") -> RunFolder:
    """Check `path` (`check`), create it if new, mark it as pdgym's and lock it against a second writer.
    A folder belongs to the app that made it (the marker names it): another app's claim is refused, as
    its results would replace that app's (pdgym-sim's metrics.json over a training's). Refusals are ConfigErrors
    naming `key`; a folder this process already holds is returned again."""
    p = check(path, key)
    if p in _HELD:
        _HELD[p].count += 1
        return _HELD[p]
    made = [d for d in (p, *p.parents) if not os.path.lexists(d)]  # deepest first
    try:
        p.mkdir(parents=True, exist_ok=True)
        before = set(os.listdir(p))
    except OSError as exc:
        raise ConfigError(f"{key}: cannot create the run folder {p}: {exc.strerror}") from None
    # never through a link, never a device or a pipe: the marker is truncated and written below
    fd = safe_files.open_nofollow(p / MARKER, os.O_RDWR | os.O_CREAT, what=key)
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigError(f"{key}: {p} is in use by another pdgym run ({_holder(p / MARKER)}); wait for it to "
                              "end or give another folder") from None
    owner = _owner(fd)
    if owner is not None and owner != app and app != "pdgym":
        os.close(fd)
        raise ConfigError(_not_yours(key, p, owner, app))
    info = json.dumps({"app": app, "pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, info.encode(), 0)
    folder = _HELD[p] = RunFolder(p, made, before, fd)
    return folder


def remove_own(path: str | os.PathLike, key: str) -> None:
    """Delete a folder only if it is pdgym's (carries the marker) and nobody holds it; absent: nothing to do."""
    p = Path(path)
    if not os.path.lexists(p):
        return
    if not is_ours(p):
        raise ConfigError(f"{key}: {p} exists and is not a pdgym run folder (no {MARKER} marker); pdgym will not "
                          "delete or move it: remove it yourself or give another folder")
    with claim(p, key):
        shutil.rmtree(p)


# --------------------------------------------------------------------------- a Hydra run's folder
def _boilerplate_only(paths: list[Path]) -> bool:
    """Nothing but the marker, Hydra's .hydra/ files, logs and multirun.yaml, also in job sub-folders."""
    for p in paths:
        if p.name in (MARKER, ".hydra", "multirun.yaml") or p.suffix == ".log":
            continue
        if not (p.is_dir() and not p.is_symlink() and _boilerplate_only(list(p.iterdir()))):
            return False
    return True


def claim_hydra(hydra_node, job_cfg, mode: str, app: str, user_given: bool) -> RunFolder:
    """Claim the folder of Hydra's `hydra.<mode>.dir` (mode: run or sweep; `hydra_node`: the composed config's
    hydra node, `job_cfg`: the job's config, whose keys the template may name), after `check_templated` when the
    app's own template named it. The resolved path is pinned into `hydra_node` so a time in it cannot move
    before Hydra creates the folder."""
    from omegaconf import OmegaConf, read_write
    from omegaconf.errors import OmegaConfBaseException

    key = f"hydra.{mode}.dir"
    try:
        template = str(OmegaConf.to_container(hydra_node[mode], resolve=False)["dir"])
        path = str(hydra_node[mode].dir)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{key}: {str(exc).splitlines()[0]}") from None
    if not user_given:
        check_templated(path, template, key, {k: OmegaConf.select(job_cfg, k) for k in template_keys(template)})
    folder = claim(path, key, app)
    try:
        subdir = hydra_node.get("output_subdir")
        refuse_links_where_hydra_writes(folder.path, key, mode, None if subdir is None else str(subdir))
        if mode == "run" and (odd := folders_at_file_names(folder.path)):  # (a sweep's job folders are named freely)
            raise ConfigError(f"{key}: {folder.path / odd[0]} is a folder where pdgym writes a file (a result of that "
                              "name); move it away, or give another folder")
    except ConfigError:
        folder.discard()
        raise
    with read_write(hydra_node):
        hydra_node[mode].dir = str(folder.path)
    return folder


HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")  # what Hydra writes into a job's output_subdir
SWEEP_FILE = "multirun.yaml"  # what Hydra's launcher writes into a sweep folder


def _plain(path: Path, key: str, folder: bool) -> None:
    """`path`, if present, is not a link and is a folder (`folder`) or a regular file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{key}: {path} is a symbolic link; Hydra writes its files there and would write through "
                          "it (to whatever it names): remove the link, or give another folder")
    if folder and not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{key}: {path} is not a folder; Hydra writes its files into a folder of that name")
    if not folder and not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{key}: {path} is not a regular file; Hydra writes a plain file of that name")


def refuse_links_where_hydra_writes(path: Path, key: str, mode: str, subdir: str | None = ".hydra") -> None:
    """Before Hydra runs a job in the claimed folder `path`: nothing where Hydra writes is a link. Hydra opens
    OUTPUT_SUBDIR/{config,hydra,overrides}.yaml with a plain open(..., "w") (hydra/core/utils.py _save_config,
    after creating the folder with mkdir(exist_ok=True)), and a sweep's launcher writes multirun.yaml and creates
    each job's subfolder the same way, so a link planted at any of those names would receive the run's config. A
    sweep folder holds no link at all (pdgym makes none there): its jobs' folders are named only when they run."""
    names = [SWEEP_FILE] if mode == "sweep" else []
    jobs = [path]
    if mode == "sweep" and path.is_dir():
        for e in sorted(os.listdir(path)):
            if os.path.islink(path / e):
                raise ConfigError(f"{key}: {path / e} is a symbolic link; a sweep folder holds none (Hydra would write "
                                  "a job's files through it): remove the link, or give another folder")
        jobs = [path / e for e in sorted(os.listdir(path)) if (path / e).is_dir() and e != subdir]
    for name in names:
        _plain(path / name, key, folder=False)
    if subdir is None:
        return
    for job in jobs:
        out = job / subdir
        _plain(out, key, folder=True)
        for name in HYDRA_FILES:
            _plain(out / name, key, folder=False)


def settle(folder: RunFolder, exc: BaseException | None, single: bool) -> None:
    """End a claim when its run ends: a run refused as bad input (exit 2) leaves none of what it added; a run
    that failed otherwise or was interrupted leaves nothing if it added only Hydra's boilerplate (a training's
    checkpoints written before Ctrl-C stay for `resume`); a multirun keeps its finished jobs."""
    code = 0 if exc is None else exc.code if isinstance(exc, SystemExit) else 130 if isinstance(
        exc, KeyboardInterrupt) else 1
    if code in (0, None):
        folder.release()
    elif (code == 2 and single) or _boilerplate_only(folder.added()):
        folder.discard()
    else:
        folder.release()
