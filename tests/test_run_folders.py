"""Run folders (agents/run_folder.py): created new or reused only when pdgym's own, never outside the place asked
for, never a user's file deleted or moved, one writer at a time. Every refusal is one line, exit 2, nothing written.

The apps run in-process (their `main(argv)`) from a temporary working directory, as in tests/test_bad_input.py.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pdgym.agents import run_folder
from pdgym.agents.run_folder import MARKER
from pdgym.envs.sim.config import ConfigError

# Each app with arguments that pass its validation quickly: only the run folder is wrong.
VALID = {
    "pdgym-sim": ("pdgym.agents.apps.sim", ["workload.num_requests=20", "plots=false"]),
    "pdgym-eval": ("pdgym.agents.evaluation.evaluate", ["policy=br0", "scenario=decode_tier_n16"]),
    "pdgym-enjoy": ("pdgym.agents.apps.enjoy", ["policy=br0", "scenario=decode_tier_n16"]),
    "pdgym-train": ("pdgym.agents.training.train", ["total_timesteps=64", "wandb.mode=disabled"]),
    "pdgym-profile": ("pdgym.agents.apps.profile", ["profile.shrink=32"]),
}


def _run(app: str, argv: list[str], cwd: Path, monkeypatch, capsys) -> tuple[int, list[str], str]:
    monkeypatch.chdir(cwd)
    module, base = VALID.get(app, (None, []))
    main = importlib.import_module(module or {"pdgym-repro": "pdgym.agents.apps.repro",
                                              "pdgym-leaderboard": "pdgym.agents.apps.leaderboard"}[app]).main
    with pytest.raises(SystemExit) as exc:
        main([*base, *argv])
    err = capsys.readouterr().err
    return exc.value.code, [ln for ln in err.splitlines() if ln.strip()], err


def _one_line(code: int, lines: list[str], err: str, app: str, *want: str) -> None:
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"{app}: error: ") and all(w in lines[0] for w in want), lines[0]
    assert "Traceback" not in err


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root with a file's bytes (None for a folder): what a refused run must leave as it was."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def _places(tmp: Path) -> dict[str, tuple[str, str]]:
    """hydra.run.dir values that are refused, with the words the line must hold."""
    (tmp / "user.txt").write_text("the user's own file\n")
    (tmp / "userdir").mkdir()
    (tmp / "userdir" / "notes.txt").write_text("keep me\n")
    return {
        "file": (str(tmp / "user.txt"), "existing file"),
        "under_file": (str(tmp / "user.txt" / "sub"), "under a file"),
        "user_folder": (str(tmp / "userdir"), "not a pdgym run folder"),
        "root": ("/", "filesystem root"),
        "cwd": (".", "working directory"),
        "parent": ("..", "working directory"),
        "proc": ("/proc/pdgym_run", "system folder"),
        "sys": ("/sys/pdgym_run", "system folder"),
        "empty": ("", "empty"),
        "new_at_root": ("/pdgym_no_such_top/run", "filesystem root"),
    }


PLACES = ["file", "under_file", "user_folder", "root", "cwd", "parent", "proc", "sys", "empty", "new_at_root"]


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("app", sorted(VALID))
def test_refused_run_folder_is_one_line_and_touches_nothing(app, place, tmp_path, monkeypatch, capsys):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    value, words = _places(tmp_path)[place]
    before = _tree(tmp_path)
    code, lines, err = _run(app, [f"hydra.run.dir={value}"], cwd, monkeypatch, capsys)
    _one_line(code, lines, err, app, "hydra.run.dir", words)
    assert _tree(tmp_path) == before, "a refused run folder changed files"
    assert not Path("/pdgym_no_such_top").exists() and not Path("/hydra").exists()


@pytest.mark.parametrize("name, words", [("../../escape", "name='../../escape'"), ("", "name: empty"),
                                         ("a/b", "name='a/b'"), ("..", "name='..'"), ("/abs/x", "name='/abs/x'")])
def test_train_name_stays_a_folder_of_its_own(name, words, tmp_path, monkeypatch, capsys):
    """runs/train/<date>/${name}: a name that is empty or holds '/' or '..' would write elsewhere."""
    code, lines, err = _run("pdgym-train", [f"name='{name}'"], tmp_path, monkeypatch, capsys)
    _one_line(code, lines, err, "pdgym-train", words)
    assert os.listdir(tmp_path) == [], "a refused name created files"


def test_leaderboard_empty_out_dir_writes_nothing_at_the_root(tmp_path, monkeypatch, capsys):
    code, lines, err = _run("pdgym-leaderboard", ["out_dir="], tmp_path, monkeypatch, capsys)
    _one_line(code, lines, err, "pdgym-leaderboard", "out_dir: empty")
    assert not Path("/hydra").exists() and os.listdir(tmp_path) == []


def test_sim_reuses_only_its_own_folder(tmp_path, monkeypatch, capsys):
    """A new folder is marked; running again into it is fine; an empty folder is taken; a user's is not."""
    monkeypatch.chdir(tmp_path)
    sim = importlib.import_module("pdgym.agents.apps.sim").main
    out, empty = tmp_path / "run", tmp_path / "empty"
    empty.mkdir()
    for folder in (out, out, empty):
        sim(["workload.num_requests=20", "plots=false", f"hydra.run.dir={folder}"])
        assert (folder / MARKER).is_file() and (folder / "metrics.json").is_file()
    capsys.readouterr()


def test_repro_twice_keeps_a_users_file_and_folders(tmp_path, monkeypatch, capsys):
    """pdgym-repro into a folder holding a user's file (it was deleted on the second run), into a file (it was moved
    aside), next to a user's NAME.previous / NAME.partial (deleted): all refused, all kept."""
    user = tmp_path / "mine"
    user.mkdir()
    (user / "data.txt").write_text("precious\n")
    (tmp_path / "afile").write_text("a file\n")
    (tmp_path / "r.previous").mkdir()
    (tmp_path / "r.previous" / "x.txt").write_text("mine too\n")
    (tmp_path / "q.partial").mkdir()
    (tmp_path / "q.partial" / "y.txt").write_text("and this\n")
    before = _tree(tmp_path)
    args = ["md1_check", "repro.num_requests=300"]
    for out, words in ((user, "not a pdgym run folder"), (user, "not a pdgym run folder"),
                       (tmp_path / "afile", "existing file"), (tmp_path / "r", "r.previous"),
                       (tmp_path / "q", "q.partial")):
        code, lines, err = _run("pdgym-repro", [*args, f"hydra.run.dir={out}"], tmp_path, monkeypatch, capsys)
        _one_line(code, lines, err, "pdgym-repro", words)
    assert _tree(tmp_path) == before


def test_repro_replaces_only_its_own_previous_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    repro = importlib.import_module("pdgym.agents.apps.repro").main
    out = tmp_path / "r"
    for _ in range(3):
        repro(["md1_check", "repro.num_requests=300", "repro.max_requests=300", f"hydra.run.dir={out}"])
    capsys.readouterr()
    assert sorted(os.listdir(tmp_path)) == ["r", "r.previous"]
    assert run_folder.is_ours(out) and run_folder.is_ours(tmp_path / "r.previous")
    assert (out / "summary.json").is_file() and (tmp_path / "r.previous" / "summary.json").is_file()


HOLD = """
import sys, time
from pdgym.agents.run_folder import claim
claim(sys.argv[1], "hydra.run.dir", "pdgym-train")
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("app", ["pdgym-sim", "pdgym-train"])
def test_second_writer_is_refused(app, tmp_path, monkeypatch, capsys):
    """Another process holds the folder (a training in progress): a second run into it is refused in one line."""
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = _tree(tmp_path)
        code, lines, err = _run(app, [f"hydra.run.dir={out}"], tmp_path, monkeypatch, capsys)
        _one_line(code, lines, err, app, "in use by another pdgym run", "pdgym-train, pid")
        assert _tree(tmp_path) == before
    finally:
        holder.kill()
        holder.wait()
    # the kernel drops the lock with its holder, however it ended: the folder is free again
    with run_folder.claim(out, "hydra.run.dir"):
        pass


# --------------------------------------------------------------------------- the owner itself
def test_discard_removes_only_what_the_claim_added(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    new = run_folder.claim(tmp_path / "a" / "b" / "run", "k")
    (new.path / "result.json").write_text("{}")
    new.discard()
    assert os.listdir(tmp_path) == [], "the folder and the parents the claim made go"

    old = tmp_path / "old"
    old.mkdir()
    (old / MARKER).write_text("")
    (old / "earlier.csv").write_text("kept\n")
    (old / "sub").mkdir()
    reused = run_folder.claim(old, "k")
    (old / "new.csv").write_text("x")
    (old / "newdir").mkdir()
    (old / "sub" / "inside.txt").write_text("x")  # inside an entry that was there: not this claim's to judge
    reused.discard()
    assert sorted(os.listdir(old)) == sorted([MARKER, "earlier.csv", "sub"])


def test_claim_is_reentrant_in_one_process_and_released(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = run_folder.claim(tmp_path / "run", "k")
    b = run_folder.claim(tmp_path / "run", "k")
    assert a is b
    b.release()
    a.release()
    assert not run_folder._HELD


def test_read_only_place_is_one_line(tmp_path, monkeypatch):
    """Root may write anywhere, so the refusal is shown by a folder the access check reports read-only."""
    monkeypatch.chdir(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if Path(p) == ro else real(p, mode, **k))
    for target in (ro, ro / "run"):
        with pytest.raises(ConfigError, match="read-only"):
            run_folder.check(target, "hydra.run.dir")


@pytest.mark.parametrize("template, path, values, ok", [
    ("runs/train/${now:%Y}/${name}", "runs/train/2026/x", {"name": "x"}, True),
    ("runs/train/${now:%Y}/${name}", "runs/escape", {"name": "../../escape"}, False),
    ("runs/train/${now:%Y}/${name}", "runs/train/2026", {"name": "."}, False),
    ("runs/train/${now:%Y}/${name}", "runs/train/2026/a/b", {"name": "a/b"}, False),
    ("runs/sim/${now:%Y}/${now:%H}_${hydra:runtime.choices.scenario}", "runs/sim/2026/07_s", {}, True),
    ("${out_dir}/hydra/${now:%Y}", "lb/hydra/2026", {"out_dir": "lb"}, True),
    ("${out_dir}/hydra/${now:%Y}", "/hydra/2026", {"out_dir": ""}, False),
    ("runs/x/${pdgym_dirname:${a}/b}/${name}", "runs/x/q/n", {"name": "n", "a": "q"}, True),
])
def test_templated_folder(template, path, values, ok, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if ok:
        run_folder.check_templated(path, template, "hydra.run.dir", values)
    else:
        with pytest.raises(ConfigError):
            run_folder.check_templated(path, template, "hydra.run.dir", values)


# --------------------------------------------------------------------------- multiruns
@pytest.mark.parametrize("argv, words", [
    (["-m", "seed=range(0)"], "a sweep with no value"),
    (["-m", "seed=0,-1"], "seed"),
    (["-m", "seed=0,1", "hydra.sweep.dir=/"], "hydra.sweep.dir"),
    (["-m", "seed=0,1", "hydra.sweep.dir=."], "hydra.sweep.dir"),
    (["hydra.mode=MULTIRUN", "seed=0,1"], "hydra.mode"),
])
def test_multirun_refusals_write_nothing(argv, words, tmp_path, monkeypatch, capsys):
    code, lines, err = _run("pdgym-sim", argv, tmp_path, monkeypatch, capsys)
    _one_line(code, lines, err, "pdgym-sim", words)
    assert os.listdir(tmp_path) == []


def test_multirun_sweep_folder_is_marked_and_pinned(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "my sweep"
    importlib.import_module("pdgym.agents.apps.sim").main(
        ["-m", "seed=0,1", "workload.num_requests=20", "plots=false", f"hydra.sweep.dir={sweep}"])
    capsys.readouterr()
    assert (sweep / MARKER).is_file()
    assert sorted(p.name.split("_")[0] for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
    assert all((p / "metrics.json").is_file() for p in sweep.iterdir() if p.is_dir())


# --------------------------------------------------------------------------- the marker is read bounded
@pytest.mark.parametrize("target", ["/dev/zero", "user"])
def test_marker_that_is_a_link_is_refused_and_its_target_untouched(target, tmp_path, monkeypatch):
    """The claim truncates and writes its marker: never through a link (a user's file would be emptied), never
    a device (/dev/zero: a traceback, or a hang where it is read)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "user.txt").write_text("the user's own file\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / MARKER).symlink_to(tmp_path / "user.txt" if target == "user" else target)
    with pytest.raises(ConfigError, match="is a symbolic link") as e:
        run_folder.claim(run, "hydra.run.dir")
    assert str(e.value).startswith("hydra.run.dir: ") and "\n" not in str(e.value)
    assert (tmp_path / "user.txt").read_text() == "the user's own file\n" and not run_folder._HELD


def test_marker_that_is_a_pipe_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / MARKER)
    with pytest.raises(ConfigError, match="not a regular file"):
        run_folder.claim(run, "hydra.run.dir")


def test_holder_is_read_from_at_most_a_bounded_marker(tmp_path, monkeypatch):
    """Who holds a folder comes from its marker: a huge one, a device or junk is not read, only named vaguely."""
    import fcntl

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / MARKER).write_text('{"app": "pdgym-sim", "pid": 42}' + " " * (run_folder.MAX_MARKER_BYTES + 1))
    with open(run / MARKER) as held:  # another process's lock on the marker
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match=r"in use by another pdgym run \(another pdgym process\)"):
            run_folder.claim(run, "hydra.run.dir")
    link = tmp_path / "zero"
    link.symlink_to("/dev/zero")
    for data in (b'{"app": "pdgym-sim", "pid": 42}', b"[1]", b'{"pid": "x"}', b"\xff"):
        (run / MARKER).write_bytes(data)
        assert run_folder._holder(run / MARKER) == ("pdgym-sim, pid 42" if data.startswith(b'{"app"')
                                                    else "another pdgym process")
    assert run_folder._holder(link) == "another pdgym process"


# --------------------------------------------------------------------------- links planted in a run folder (#38)
# Each app with arguments giving many of the names it writes (plots, traces, compare sets), run twice into one folder.
LINKED = {
    "pdgym-sim": ["workload.num_requests=10", "trace=true", "compare=[{label: a}, {label: b, decode: least_kv}]"],
    "pdgym-eval": ["policy=br0", "scenario=decode_tier_n16", "workload.num_requests=40", "seeds=[0]"],
    "pdgym-enjoy": ["policy=br0", "scenario=decode_tier_n8", "workload.num_requests=24", "every=4", "max_frames=3",
                    "batch=2"],
}


def _main(app: str, argv: list[str], cwd: Path, monkeypatch, capsys) -> tuple[int, list[str], str]:
    """`app`'s main run in-process from `cwd`: (exit code, 0 when it returned, its non-blank stderr lines, stderr)."""
    monkeypatch.chdir(cwd)
    module = VALID[app][0] if app in VALID else "pdgym.agents.apps.repro"
    try:
        importlib.import_module(module).main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    return code, [ln for ln in err.splitlines() if ln.strip()], err


def _written(run: Path) -> list[str]:
    """Every regular file under `run` (links not followed), relative: the names the app wrote there."""
    out = []
    for d, _dirs, files in os.walk(run):
        out += [str((Path(d) / f).relative_to(run)) for f in files if (Path(d) / f).is_file()]
    return sorted(n for n in out if n != MARKER)


def _old_temporary(name: str) -> str:
    """The fixed temporary name the atomic writer used before (`.metrics.json.partial.json`)."""
    p = Path(name)
    return str(p.with_name(f".{p.name}.partial{p.suffix}"))


def _plant(run: Path, names: list[str], user: Path) -> dict[Path, bytes]:
    """At each name under `run`, a link to a user file of its own (the name's file removed first); {target: bytes}."""
    user.mkdir(exist_ok=True)
    targets = {}
    for i, name in enumerate(names):
        target = user / f"file{i}{Path(name).suffix}"
        target.write_bytes(f"the user's file {i}\n".encode())
        (run / name).unlink(missing_ok=True)
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).symlink_to(target)
        targets[target] = target.read_bytes()
    return targets


@pytest.mark.parametrize("app", sorted(LINKED))
def test_links_at_every_name_an_app_writes_receive_nothing(app, tmp_path, monkeypatch, capsys):
    """Run once; plant a link to a user file at every name the run wrote (results and the old fixed temporaries,
    outside .hydra/); run again into the folder: the links are replaced, not one byte reaches a user file."""
    run, argv = tmp_path / "run", [*LINKED[app], f"hydra.run.dir={tmp_path / 'run'}"]
    code, _, err = _main(app, argv, tmp_path, monkeypatch, capsys)
    assert code == 0, err
    names = [n for n in _written(run) if not n.startswith(".hydra")]
    assert {"metrics.json", "summary.json"} & set(names) and len(names) >= 2, names
    temporaries = [_old_temporary(n) for n in names]
    targets = _plant(run, names + temporaries, tmp_path / "user")
    code, _, err = _main(app, argv, tmp_path, monkeypatch, capsys)
    assert code == 0 and "Traceback" not in err, err
    assert {t: t.read_bytes() for t in targets} == targets, "a run wrote through a link"
    assert not any((run / n).is_symlink() for n in names if (run / n).exists()), "a link at a result stayed"
    assert sorted(p.name for p in (tmp_path / "user").iterdir()) == sorted(t.name for t in targets)


@pytest.mark.parametrize("where", [".hydra", ".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml"])
def test_links_where_hydra_writes_are_refused_before_it_writes(where, tmp_path, monkeypatch, capsys):
    """Hydra opens .hydra/{config,hydra,overrides}.yaml with a plain open(): a link there (or at .hydra) in a run
    folder pdgym-sim made is refused in one line before Hydra writes, and the user's file or folder is untouched."""
    import json

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / MARKER).write_text(json.dumps({"app": "pdgym-sim", "pid": 1}))
    user = tmp_path / "user"
    user.mkdir()
    (user / "config.yaml").write_text("the user's own config\n")
    if where == ".hydra":
        (run / ".hydra").rmdir()
        (run / ".hydra").symlink_to(user)
    else:
        (run / where).symlink_to(user / "config.yaml")
    before = _tree(user)
    code, lines, err = _main("pdgym-sim", ["workload.num_requests=20", "plots=false", f"hydra.run.dir={run}"], tmp_path,
                             monkeypatch, capsys)
    _one_line(code, lines, err, "pdgym-sim", "symbolic link", where.split("/")[-1])
    assert _tree(user) == before and not (run / "metrics.json").exists()


@pytest.mark.parametrize("where", ["multirun.yaml", "0_seed=0"])
def test_links_in_a_sweep_folder_are_refused(where, tmp_path, monkeypatch, capsys):
    import json

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / MARKER).write_text(json.dumps({"app": "pdgym-sim", "pid": 1}))
    user = tmp_path / "user"
    user.mkdir()
    (sweep / where).symlink_to(user)
    code, lines, err = _main("pdgym-sim", ["-m", "seed=0", "workload.num_requests=20", "plots=false",
                                           f"hydra.sweep.dir={sweep}"], tmp_path, monkeypatch, capsys)
    _one_line(code, lines, err, "pdgym-sim", "symbolic link", where)
    assert list(user.iterdir()) == []


@pytest.mark.parametrize("name", ["compare", "compare/b"])
def test_sim_refuses_a_linked_compare_folder(name, tmp_path, monkeypatch, capsys):
    import json

    run, user = tmp_path / "run", tmp_path / "user"
    (run / name).parent.mkdir(parents=True, exist_ok=True)
    (run / MARKER).write_text(json.dumps({"app": "pdgym-sim", "pid": 1}))
    user.mkdir()
    (run / name).symlink_to(user)
    code, lines, err = _main("pdgym-sim", [*LINKED["pdgym-sim"], "plots=false", "trace=false", f"hydra.run.dir={run}"],
                             tmp_path, monkeypatch, capsys)
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert list(user.iterdir()) == []


def test_atomic_writer_temporary_is_fresh_and_never_a_link(tmp_path):
    """The temporary is created by the writer (O_EXCL, an unpredictable name) in the final file's folder: a link
    planted at the old fixed name or anywhere else is never opened; the final name's link is replaced."""
    from pdgym.envs.sim import safe_files

    user = tmp_path / "user.txt"
    user.write_text("mine\n")
    (tmp_path / "out.csv").symlink_to(user)
    (tmp_path / ".out.csv.partial.csv").symlink_to(user)
    seen = []
    with safe_files.atomic_path(tmp_path / "out.csv") as tmp:
        st = os.lstat(tmp)
        seen.append((tmp.parent, tmp.name, st.st_nlink, st.st_size))
        assert tmp.name.startswith(".out.csv.") and tmp.suffix == ".csv" and not tmp.is_symlink()
        tmp.write_text("a,b\n")
    assert seen[0][0] == tmp_path and seen[0][2:] == (1, 0)
    assert user.read_text() == "mine\n" and (tmp_path / "out.csv").read_text() == "a,b\n"
    assert not (tmp_path / "out.csv").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.csv.partial.csv", "out.csv", "user.txt"]


def test_atomic_writer_refuses_a_folder_at_the_final_name(tmp_path):
    from pdgym.envs.sim import safe_files

    (tmp_path / "steps.csv").mkdir()
    with pytest.raises(ConfigError, match="steps.csv is a folder"):
        safe_files.write_text(tmp_path / "steps.csv", "x\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.csv"]


@pytest.mark.parametrize("flags", [os.O_WRONLY | os.O_APPEND | os.O_CREAT, os.O_RDWR | os.O_CREAT])
def test_file_written_in_place_is_opened_without_following_a_link(flags, tmp_path):
    from pdgym.envs.sim import safe_files

    user = tmp_path / "user.csv"
    user.write_text("mine\n")
    (tmp_path / "log.csv").symlink_to(user)
    with pytest.raises(ConfigError, match="symbolic link"):
        safe_files.open_nofollow(tmp_path / "log.csv", flags)
    with pytest.raises(ConfigError, match="not a regular file"):
        safe_files.open_nofollow("/dev/null", flags)
    assert user.read_text() == "mine\n"


# --------------------------------------------------------------------------- a run folder belongs to its app
@pytest.mark.parametrize("app", ["pdgym-sim", "pdgym-eval"])
def test_another_apps_run_folder_is_refused(app, tmp_path, monkeypatch, capsys):
    """pdgym-sim or pdgym-eval into a pdgym-train run folder would replace the training's metrics.json."""
    import json

    run = tmp_path / "run"
    run.mkdir()
    (run / MARKER).write_text(json.dumps({"app": "pdgym-train", "pid": 1}))
    (run / "metrics.json").write_text('{"objective": 1.0}\n')
    before = _tree(run)
    code, lines, err = _main(app, [*VALID[app][1], f"hydra.run.dir={run}"], tmp_path, monkeypatch, capsys)
    _one_line(code, lines, err, app, "pdgym-train run folder")
    assert _tree(run) == before


def test_an_adopted_folder_is_claimed_by_its_first_app(tmp_path):
    """An empty marker (`touch .pdgym-run` adopts an older run) names no app: any app may claim the folder, and
    from then on it is that app's."""
    run = tmp_path / "run"
    run.mkdir()
    (run / MARKER).touch()
    run_folder.claim(run, "k", "pdgym-eval").release()
    with pytest.raises(ConfigError, match="is a pdgym-eval run folder"):
        run_folder.claim(run, "k", "pdgym-sim")
    run_folder.claim(run, "k", "pdgym-eval").release()


def test_fresh_temporary_folder_is_new_and_has_mkdirs_permissions(tmp_path):
    from pdgym.envs.sim import safe_files

    (tmp_path / ".frames.partial").symlink_to(tmp_path)  # a planted link at a guessable name is never used
    a, b = safe_files.fresh_dir(tmp_path, "frames"), safe_files.fresh_dir(tmp_path, "frames")
    assert a != b and a.parent == tmp_path and not a.is_symlink() and list(a.iterdir()) == []
    (tmp_path / "plain").mkdir()
    assert os.stat(a).st_mode & 0o777 == os.stat(tmp_path / "plain").st_mode & 0o777


@pytest.mark.parametrize("name", ["steps.csv", "metrics.json"])
def test_a_folder_where_a_result_file_goes_is_refused_before_the_run(name, tmp_path, monkeypatch, capsys):
    """A pdgym-sim folder where steps.csv (or metrics.json) is a folder: one line when the folder is claimed, and
    the earlier run's files stay (the run used to end in IsADirectoryError, its metrics.json already deleted)."""
    import json

    run = tmp_path / "run"
    (run / name).mkdir(parents=True)
    (run / name / "x.txt").write_text("the user's\n")
    (run / MARKER).write_text(json.dumps({"app": "pdgym-sim", "pid": 1}))
    (run / "requests.csv").write_text("id\n1\n")
    before = _tree(run)
    code, lines, err = _main("pdgym-sim", [*VALID["pdgym-sim"][1], f"hydra.run.dir={run}"], tmp_path, monkeypatch,
                             capsys)
    _one_line(code, lines, err, "pdgym-sim", f"{name} is a folder where pdgym writes a file")
    assert {k: v for k, v in _tree(run).items() if k != MARKER} == {k: v for k, v in before.items() if k != MARKER}


@pytest.mark.parametrize("where", ["r", "r.previous", "r.partial"])
def test_repro_neither_moves_nor_deletes_another_apps_run(where, tmp_path, monkeypatch, capsys):
    """pdgym-repro moves its previous run to NAME.previous and deletes an older one: a pdgym-sim run folder at
    NAME (or NAME.previous, NAME.partial) is refused in one line, before the run, and stays as it was."""
    import json

    run = tmp_path / where
    run.mkdir()
    (run / MARKER).write_text(json.dumps({"app": "pdgym-sim", "pid": 1}))
    (run / "metrics.json").write_text('{"objective": 1.0}\n')
    before = _tree(tmp_path)
    code, lines, err = _run("pdgym-repro", ["md1_check", "repro.num_requests=300", f"hydra.run.dir={tmp_path / 'r'}"],
                            tmp_path, monkeypatch, capsys)
    _one_line(code, lines, err, "pdgym-repro", "is a pdgym-sim run folder")
    assert _tree(tmp_path) == before


# --------------------------------------------------------------------------- a multirun's jobs, every one (issue 47)
@pytest.mark.parametrize("argv, words", [
    # every job's folder inside the sweep folder, and its own (subdir=../../escape wrote each job over the last,
    # outside the sweep folder, exit 0)
    (["-m", "seed=0,1", "hydra.sweep.dir=W/out", "hydra.sweep.subdir=../../escape"], "hydra.sweep.subdir: job 0's"),
    (["-m", "seed=0,1", "hydra.sweep.dir=W/out", "hydra.sweep.subdir=/tmp/elsewhere"], "not a folder inside"),
    (["-m", "seed=0,1", "hydra.sweep.dir=W/out", "hydra.sweep.subdir=same"], "jobs 0 and 1 would share"),
    (["-m", "seed=0,1", "hydra.sweep.dir=W/out", "hydra.sweep.subdir=."], "not a folder inside"),
    (["-m", "seed=0,1", "hydra.sweep.dir=W/out", "hydra.output_subdir=../x"], "hydra.output_subdir"),
    (["hydra.run.dir=W/run", "hydra.output_subdir=../../x"], "hydra.output_subdir"),
    # sweeps Hydra's basic sweeper cannot take: one line, not a traceback (101 lines; an uncaught HydraException)
    (["-m", "seed=range(0,300),abc"], "seed=range(0,300),abc: cannot list this sweep's values"),
    (["-m", "seed=interval(0,1)"], "seed=interval(0,1): an interval sweep needs a sweeper"),
    # checked whole before the first job: the bad value of the first axis found at once (300 jobs ran first)
    (["-m", "workload.num_requests=1,abc", "seed=range(0,300)"], "workload.num_requests: got 'abc'"),
    # a bound on the number of jobs, refused before any job is composed
    (["-m", "seed=range(0,10001)"], "10,001 jobs, more than hydra.callbacks.pdgym.max_jobs=10,000"),
    (["-m", "seed=0,1,2", "hydra.callbacks.pdgym.max_jobs=2"], "3 jobs, more than hydra.callbacks.pdgym.max_jobs=2"),
    (["-m", "seed=0,1", "hydra.callbacks.pdgym.max_jobs=0"], "hydra.callbacks.pdgym.max_jobs: got 0"),
])
def test_multirun_jobs_are_checked_whole_and_kept_in_their_folder(argv, words, tmp_path, monkeypatch, capsys):
    code, lines, err = _run("pdgym-sim", argv, tmp_path, monkeypatch, capsys)
    _one_line(code, lines, err, "pdgym-sim", words)
    assert os.listdir(tmp_path) == []


def test_job_folders_checked_are_the_folders_hydra_makes(tmp_path, monkeypatch, capsys):
    """The folder the front door computes for each job (its number and override_dirname, a job beyond the first
    re-applied onto the first's config) is the one Hydra's launcher then creates: a check of other paths would
    prove nothing."""
    from pdgym.agents import front_door

    seen = {}
    real = front_door.check_job_folders
    monkeypatch.setattr(front_door, "check_job_folders",
                        lambda sweep, subdirs, every: (seen.update(subdirs), real(sweep, subdirs, every)))
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "sw"
    importlib.import_module("pdgym.agents.apps.sim").main(
        ["-m", "seed=0,1", "workload.num_requests=20,21", "plots=false", f"hydra.sweep.dir={sweep}"])
    capsys.readouterr()
    made = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert sorted(seen.values()) == made and len(made) == 4
    assert seen[1] == "1_plots=False,seed=0,workload.num_requests=21"  # Hydra's numbering: the last axis fastest


def test_a_leaderboard_inside_another_apps_run_folder_is_refused(tmp_path, monkeypatch, capsys):
    """out_dir inside a pdgym-sim run folder nested a board among the run's results."""
    run = tmp_path / "simrun"
    run_folder.claim(run, "hydra.run.dir", "pdgym-sim").release()
    for out in (run, run / "boards"):
        code, lines, err = _run("pdgym-leaderboard", [f"out_dir={out}"], tmp_path, monkeypatch, capsys)
        _one_line(code, lines, err, "pdgym-leaderboard", "out_dir:", "another app's run folder")
    assert sorted(os.listdir(run)) == [MARKER]
