"""Files pdgym reads that it did not write in this process (envs/sim/safe_files.py): a regular file only (no device,
no pipe, no symlink out of the run folder), a size bound checked before a byte is read, text that must be UTF-8;
agent.json, model archives and cost tables of every broken kind are one line, exit 2, nothing written."""

from __future__ import annotations

import gzip
import importlib
import json
import os
import re
import zipfile
from pathlib import Path

import pytest
from pdgym.agents.learned import model_store as M
from pdgym.envs.sim import safe_files
from pdgym.envs.sim.config import ConfigError

META = {"point": "decode", "env_id": "pdgym/DecodeRouting-v0", "env_kwargs": {}}


# --------------------------------------------------------------------------- the helper
def test_regular_file_within_its_bound_is_read(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("héllo\n")
    assert safe_files.read_text(f, 100, "what", within=tmp_path) == "héllo\n"
    link = tmp_path / "b.txt"
    link.symlink_to(f)  # a link that stays inside the folder is fine
    assert safe_files.check_regular_file(link, 100, "what", within=tmp_path) == link


def _fifo(tmp_path: Path) -> Path:
    p = tmp_path / "fifo"
    os.mkfifo(p)
    return p


@pytest.mark.parametrize("make, words", [
    (lambda t: Path("/dev/zero"), "a device, pipe or socket"),
    (lambda t: Path("/dev/null"), "a device, pipe or socket"),
    (_fifo, "a device, pipe or socket"),
    (lambda t: t, "a folder"),
    (lambda t: t / "missing.csv", "file not found"),
])
def test_not_a_regular_file_is_refused_without_reading(make, words, tmp_path):
    with pytest.raises(ConfigError, match=words) as e:
        safe_files.read_bytes(make(tmp_path), 1 << 20, "cost.params.path")
    assert str(e.value).startswith("cost.params.path: ") and "\n" not in str(e.value)


def test_symlink_out_of_the_folder_is_refused(tmp_path):
    run, outside = tmp_path / "run", tmp_path / "elsewhere.zip"
    run.mkdir()
    outside.write_bytes(b"x")
    for target in (outside, Path("/dev/zero")):
        link = run / f"best_{target.name}"
        link.symlink_to(target)
        with pytest.raises(ConfigError, match="leads outside|not a regular file"):
            safe_files.check_regular_file(link, 1 << 20, "policy", within=run)


def test_size_bound_is_checked_before_reading(tmp_path, monkeypatch):
    """A sparse 4 GiB file costs no disk; refusing it must not open it (the audit's trace took 7.5 GB first)."""
    big = tmp_path / "big.csv"
    with open(big, "wb") as fh:
        fh.truncate(4 << 30)
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    with pytest.raises(ConfigError, match=r"4.0 GiB, more than the 64.0 MiB"):
        safe_files.read_bytes(big, 64 << 20, "workload.trace")
    assert opened == []


@pytest.mark.parametrize("data, words", [
    (gzip.compress(b"phase,tokens,time_s\n", mtime=0), "gzip-compressed"),
    (b"phase,tokens,time_s\nprefill,1,\xff\n", "not UTF-8"),
    ("phase,tokens\n".encode("utf-16"), "not UTF-8"),
])
def test_text_that_is_not_utf8_is_one_line(data, words, tmp_path):
    f = tmp_path / "t.csv"
    f.write_bytes(data)
    with pytest.raises(ConfigError, match=words) as e:
        safe_files.read_text(f, 1 << 20, "cost.params.path")
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- model archives
def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def test_model_member_over_its_bound_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = _zip(tmp_path / "m.zip", {M.MANIFEST: json.dumps({"format": M.FORMAT, "members": ["policy.pt"]}),
                                     "policy.pt": b"\0" * 5000})
    monkeypatch.setattr(M, "MAX_MEMBER_BYTES", 4096)
    read = []
    real = zipfile.ZipFile.read
    monkeypatch.setattr(zipfile.ZipFile, "read", lambda self, name, *a: read.append(name) or real(self, name, *a))
    with pytest.raises(M.ModelFileError, match="member policy.pt is 4.9 KiB|member policy.pt is 5000 bytes"):
        M.read(path)
    assert "policy.pt" not in read
    assert not M.is_complete(path)


def test_model_manifest_over_its_bound_is_refused(tmp_path):
    path = _zip(tmp_path / "m.zip", {M.MANIFEST: b" " * (M.MAX_MANIFEST_BYTES + 1)})
    with pytest.raises(M.ModelFileError, match="member pdgym_model.json"):
        M.read(path)


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom"])
def test_model_that_is_a_device_is_one_line(target, tmp_path):
    link = tmp_path / "best_model.zip"
    link.symlink_to(target)
    with pytest.raises(M.ModelFileError, match="not a regular file"):
        M.read(link)
    assert not M.is_complete(link)


def test_checkpoints_are_only_model_steps_zips(tmp_path):
    for name in ("model_128.zip", "model_x1.zip", "model_64.zip", "model_.zip", "model_1e3.zip", "model_9.zip.tmp"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in M.checkpoints(tmp_path)] == ["model_64.zip", "model_128.zip"]


# --------------------------------------------------------------------------- a run folder's agent.json, in the apps
def _run_folder(root: Path, meta: bytes | None, model: str | None = "junk") -> Path:
    run = root / "agent_run"
    (run / "checkpoints").mkdir(parents=True)
    if meta is not None:
        (run / "agent.json").write_bytes(meta)
    if model == "junk":
        (run / "best_model.zip").write_bytes(b"not a zip")
    elif model == "x1":
        (run / "checkpoints" / "model_x1.zip").write_bytes(b"")
    elif model is not None:
        (run / "best_model.zip").symlink_to(model)
    return run


GOOD = json.dumps(META).encode()
BROKEN = [
    ("not_json", b"{bad", None, "not valid JSON"),
    ("list", b"[1, 2]", None, "holds a JSON list"),
    ("missing_keys", b'{"point": "decode"}', None, "no valid 'env_id'"),
    ("wrong_type", json.dumps(dict(META, env_kwargs=[1])).encode(), None, "no valid 'env_kwargs'"),
    ("bad_point", json.dumps(dict(META, point="nowhere")).encode(), None, "decision point 'nowhere'"),
    ("not_utf8", b"\xff\xfe{}", None, "not UTF-8"),
    ("gzip", gzip.compress(GOOD, mtime=0), None, "gzip-compressed"),
    ("folder", None, "mkdir", "a folder"),
    ("device", None, "/dev/zero", "a device"),
    ("checkpoint_x1", GOOD, "x1", "no best_model.zip"),
    ("model_device", GOOD, "/dev/zero", "a device"),
    ("model_outside", GOOD, "OUTSIDE", "leads outside"),
    ("model_junk", GOOD, "junk", "unreadable or truncated model file"),
    # issue 38: a value nested 100,000 deep (json.loads: RecursionError), an env id outside pdgym's registry
    # (gymnasium's CartPole-v1 has no AgentPolicy), env_kwargs the app sets itself (make_env got config twice)
    ("deep", b"[" * 100_000 + b"]" * 100_000, None, "nests its values too deeply"),
    ("deep_object", b'{"point": ' * 5_000 + b"1" + b"}" * 5_000, None, "nests its values too deeply"),
    ("cartpole", json.dumps(dict(META, env_id="CartPole-v1")).encode(), None, "env_id 'CartPole-v1'"),
    ("other_point_env", json.dumps(dict(META, env_id="pdgym/PrefillDispatch-v0")).encode(), None,
     "runs in pdgym/DecodeRouting-v0"),
    ("config_kwarg", json.dumps(dict(META, env_kwargs={"config": {}})).encode(), None, "env_kwargs ['config']"),
]
APPS = {
    "pdgym-eval": ("pdgym.agents.evaluation.evaluate", ["scenario=decode_tier_n16"], "policy={run}"),
    "pdgym-enjoy": ("pdgym.agents.apps.enjoy", ["scenario=decode_tier_n16"], "policy={run}"),
    "pdgym-leaderboard": ("pdgym.agents.apps.leaderboard", ["preset=tiny"], "agents=[{{label: a, path: {run}}}]"),
}


@pytest.mark.parametrize("case", BROKEN, ids=[c[0] for c in BROKEN])
@pytest.mark.parametrize("app", sorted(APPS))
def test_broken_agent_run_folder_is_one_line_and_writes_nothing(app, case, tmp_path, monkeypatch, capsys):
    _, meta, model, words = case
    src = tmp_path / "src"
    src.mkdir()
    if model == "OUTSIDE":
        model = str(tmp_path / "outside.zip")
        Path(model).write_bytes(b"x")
    run = _run_folder(src, meta if meta is not None else GOOD, model if model not in (None, "mkdir") else "junk")
    if model == "mkdir" or (meta is None and model == "/dev/zero"):  # agent.json itself is a folder / a device
        (run / "agent.json").unlink()
        (run / "agent.json").mkdir() if model == "mkdir" else (run / "agent.json").symlink_to("/dev/zero")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    module, base, arg = APPS[app]
    with pytest.raises(SystemExit) as exc:
        importlib.import_module(module).main([*base, arg.format(run=run), f"hydra.run.dir={cwd / 'out'}",
                                              f"out_dir={cwd / 'boards'}"] if app == "pdgym-leaderboard" else
                                             [*base, arg.format(run=run), f"hydra.run.dir={cwd / 'out'}"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exc.value.code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"{app}: error: ") and words in lines[0], lines[0]
    assert "Traceback" not in err and "Warning" not in err
    assert os.listdir(cwd) == [], "a broken agent left files"


# --------------------------------------------------------------------------- cost tables, in pdgym-sim
COST = [
    ("inf", b"phase,tokens,time_s\nprefill,100,inf\ndecode,1,0.01\n", "not a finite number"),
    ("nan", b"phase,tokens,time_s\nprefill,100,0.1\ndecode,nan,0.01\n", "not a finite number"),
    ("latin1", "phase,tokens,time_s\nprefill,100,0.1\ndecode,1,0.01 µs\n".encode("latin-1"), "not UTF-8"),
    ("gzip", gzip.compress(b"phase,tokens,time_s\nprefill,100,0.1\ndecode,1,0.01\n", mtime=0), "gzip-compressed"),
    ("device", None, "a device"),
    ("folder", "mkdir", "a folder"),
]


@pytest.mark.parametrize("case", COST, ids=[c[0] for c in COST])
def test_broken_cost_table_is_one_line(case, tmp_path, monkeypatch, capsys):
    name, data, words = case
    table = tmp_path / "table.csv"
    if data is None:
        table.symlink_to("/dev/zero")
    elif data == "mkdir":
        table.mkdir()
    else:
        table.write_bytes(data)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    sim = importlib.import_module("pdgym.agents.apps.sim").main
    with pytest.raises(SystemExit) as exc:
        sim(["scenario=coloc_h200_qwen3_8b", "cost.kind=table", f"+cost.params.path={table}",
             "workload.num_requests=20", f"hydra.run.dir={cwd / 'out'}"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exc.value.code == 2 and len(lines) == 1 and "cost.params.path" in lines[0] and words in lines[0], err
    assert os.listdir(cwd) == []


# --------------------------------------------------------------------------- pdgym-train's resume reads agent.json
@pytest.mark.parametrize("meta, words", [(b"{bad", "not valid JSON"), (b"[]", "holds a JSON list"),
                                         (b"\xff", "not UTF-8")])
def test_train_resume_with_a_broken_agent_json_is_one_line(meta, words, tmp_path, monkeypatch, capsys):
    from pdgym.agents.run_folder import MARKER

    run = tmp_path / "run"
    run.mkdir()
    (run / MARKER).write_text("")  # an earlier pdgym run's folder
    (run / "agent.json").write_bytes(meta)
    before = sorted(os.listdir(run))
    monkeypatch.chdir(tmp_path)
    train = importlib.import_module("pdgym.agents.training.train").main
    with pytest.raises(SystemExit) as exc:
        train(["total_timesteps=64", f"hydra.run.dir={run}"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exc.value.code == 2 and len(lines) == 1 and lines[0].startswith("pdgym-train: error: resume: "), err
    assert words in lines[0]
    assert sorted(os.listdir(run)) == before


# --------------------------------------------------------------------------- YAML, CSV and keys of stored files
def test_yaml_csv_and_keys_of_stored_files(tmp_path):
    f = tmp_path / "f"
    f.write_text("a: {b: [1, 2]}\n")
    doc = safe_files.read_yaml(f, 1 << 10, "k")
    assert doc == {"a": {"b": [1, 2]}} and safe_files.get_key(doc, "a.b", list, "k", f) == [1, 2]
    assert safe_files.get_key(doc, "a.c", int, "k", f, default=7) == 7
    for key, kind, words in [("a.c", int, "has no a.c"), ("a.b", dict, "a.b = '[1, 2]', a list; expected dict"),
                             ("a.b.c", int, "a.b is a list, not a mapping")]:
        with pytest.raises(ConfigError, match=re.escape(words)):
            safe_files.get_key(doc, key, kind, "k", f)
    with pytest.raises(ConfigError, match="expected int"):  # a bool is no count
        safe_files.get_key({"n": True}, "n", int, "k", f)
    for text, words in [("a: &x [1]\nb: *x\n", "alias"), ("a: [1\n", "not valid YAML"),
                        ("!!python/object/apply:os.system ['true']\n", "not valid YAML"),
                        ("[" * 100_000, "nests its values too deeply")]:
        f.write_text(text)
        with pytest.raises(ConfigError, match=words) as e:
            safe_files.read_yaml(f, 1 << 20, "k")
        assert "\n" not in str(e.value)
    f.write_text("[" * 100_000)
    with pytest.raises(ConfigError, match="nests its values too deeply"):
        safe_files.read_json(f, 1 << 20, "k")
    for text, words in [("", "is empty"), ('a,b\n1,2\n"x,3\n', "not a valid CSV table"), ("a,b\n1,2\n3,4,5,6\n", "Expected 2 fields")]:
        f.write_text(text)
        with pytest.raises(ConfigError, match=words):
            safe_files.read_csv(f, 1 << 20, "k")


# --------------------------------------------------------------------------- pdgym-curves reads every run first
CONFIG = ("env: {id: pdgym/DecodeRouting-v0, point: decode, scenario: decode_tier_n16, primary: imbalance_mean}\n"
          "eval: {freq: 64, seeds: [0], split: val}\n"
          "splits: {val: {seed_base: 500, trace_from: 0.45, trace_to: 0.55}}\nseed: 0\nname: r\n")
HISTORY = "timesteps,imbalance_mean\n64,0.5\n128,0.4\n"


def _train_run(root: Path, name: str = "r") -> Path:
    """A pdgym-train run folder as it is read back (no training: its files written directly)."""
    run = root / name
    run.mkdir(parents=True)
    (run / "agent.json").write_text(json.dumps(dict(META, primary="imbalance_mean")))
    (run / "config.yaml").write_text(CONFIG)
    (run / "eval_history.csv").write_text(HISTORY)
    (run / "progress.csv").write_text("time/total_timesteps,rollout/ep_rew_mean\n64,-3.0\n128,-2.5\n")
    return run


def _curves(argv: list[str], capsys) -> tuple[int, list[str], str]:
    from pdgym.agents.training import curves

    with pytest.raises(SystemExit) as exc:
        curves.main(argv)
    err = capsys.readouterr().err
    return exc.value.code, [ln for ln in err.splitlines() if ln.strip()], err


def test_curves_of_run_folders_read_back(tmp_path, capsys):
    from pdgym.agents.training import curves

    runs = [_train_run(tmp_path, "a"), _train_run(tmp_path, "b")]
    curves.main([*map(str, runs), "--out", str(tmp_path / "c.png")])
    assert capsys.readouterr().out.splitlines()[0] == str(tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 0 and all((r / "curves.png").is_file() for r in runs)


def _bad_config(text: str):
    return lambda run: (run / "config.yaml").write_text(text)


CURVES = [  # (case, how the run's file is broken, the words of the line, whether it needs --baselines)
    ("meta_device", lambda r: _link(r / "agent.json", "/dev/zero"), "a device", False),
    ("meta_no_primary", lambda r: (r / "agent.json").write_text(json.dumps(META)), "has no primary", False),
    ("meta_primary_list", lambda r: (r / "agent.json").write_text(json.dumps(dict(META, primary=[1]))),
     "primary = '[1]', a list", False),
    ("meta_primary_unknown", lambda r: (r / "agent.json").write_text(json.dumps(dict(META, primary="x"))),
     "primary = 'x'; allowed", False),
    ("config_device", lambda r: _link(r / "config.yaml", "/dev/zero"), "a device", False),
    ("config_big", lambda r: (r / "config.yaml").write_text(CONFIG + "#" * 2000), "more than the", False),
    ("config_latin1", lambda r: (r / "config.yaml").write_bytes("name: é\n".encode("latin-1")), "not UTF-8", False),
    ("config_list", _bad_config("- 1\n- 2\n"), "holds a YAML list", False),
    ("config_outside", lambda r: _link(r / "config.yaml", r.parent / "elsewhere.yaml"), "leads outside", False),
    ("config_no_eval_split", _bad_config(CONFIG.replace(", split: val", "")), "config.yaml has no eval.split", True),
    ("config_no_env", _bad_config(CONFIG.split("\n", 1)[1]), "config.yaml has no env", True),
    ("config_no_split", _bad_config(CONFIG.replace("{val: ", "{test: ")), "has no splits.val", True),
    ("config_seeds", _bad_config(CONFIG.replace("seeds: [0]", "seeds: [a]")), "eval.seeds", True),
    ("config_env_type", _bad_config(CONFIG.replace("point: decode", "point: [1]")), "env.point", True),
    ("config_code", _bad_config(CONFIG.replace("primary: imbalance_mean}", "primary: imbalance_mean, policies: "
                                               "{prefill: 'os:system'}}")), "names the policy 'os:system'", True),
    ("history_device", lambda r: _link(r / "eval_history.csv", "/dev/zero"), "a device", False),
    ("history_big", lambda r: (r / "eval_history.csv").write_text(HISTORY * 200), "more than the", False),
    ("history_latin1", lambda r: (r / "eval_history.csv").write_bytes(b"timesteps,imbalance_mean\n1,\xe9\n"),
     "not UTF-8", False),
    ("history_ragged", lambda r: (r / "eval_history.csv").write_text('timesteps,imbalance_mean\n"1,2\n'),
     "not a valid CSV", False),
    ("history_empty", lambda r: (r / "eval_history.csv").write_text(""), "is empty", False),
    ("history_no_primary", lambda r: (r / "eval_history.csv").write_text("timesteps,x\n1,2\n"),
     "no column 'imbalance_mean'", False),
    ("history_text", lambda r: (r / "eval_history.csv").write_text("timesteps,imbalance_mean\n1,abc\n"),
     "not numbers", False),
    ("progress_fifo", lambda r: (r / "progress.csv").unlink() or os.mkfifo(r / "progress.csv"), "a device", False),
    ("progress_no_steps", lambda r: (r / "progress.csv").write_text("rollout/ep_rew_mean\n1\n"),
     "no column 'time/total_timesteps'", False),
]


def _link(path: Path, target) -> None:
    path.unlink(missing_ok=True)
    if str(target).endswith("elsewhere.yaml"):
        Path(target).write_text(CONFIG)
    path.symlink_to(target)


@pytest.mark.parametrize("case", CURVES, ids=[c[0] for c in CURVES])
def test_broken_run_file_in_curves_is_one_line_and_draws_nothing(case, tmp_path, monkeypatch, capsys):
    from pdgym.agents.training import run_files

    _, breaks, words, baselines = case
    monkeypatch.setattr(run_files, "MAX_CONFIG_BYTES", 1024)  # small bounds: no huge file written
    monkeypatch.setattr(run_files, "MAX_LOG_BYTES", 2048)
    good, run = _train_run(tmp_path, "good"), _train_run(tmp_path, "bad")
    breaks(run)
    out = tmp_path / "c.png"
    code, lines, err = _curves([str(run), str(good), "--out", str(out), *(["--baselines", "least_kv"] * baselines)],
                               capsys)
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("pdgym-curves: error: runs: ") and words in lines[0], lines[0]
    assert "Traceback" not in err
    assert not out.exists() and not (good / "curves.png").exists() and not (run / "curves.png").exists()


# --------------------------------------------------------------------------- what pdgym-train reads back
@pytest.mark.parametrize("name, data, words", [
    ("eval_history.csv", None, "a device"),
    ("eval_history.csv", b"timesteps,imbalance_mean\n1,\xff\n", "not UTF-8"),
    ("eval_history.csv", b"timesteps\n1\n", "no column 'imbalance_mean'"),
    ("eval_history.csv", b"", "is empty"),
    ("best_metrics.json", None, "a device"),
    ("best_metrics.json", b"[1, 2]", "has no timesteps (its top level is a list"),
    ("best_metrics.json", b'{"timesteps": 5, "metrics": {}}', "has no metrics.imbalance_mean.mean"),
    ("best_metrics.json", b'{"timesteps": "5", "metrics": {}}', "timesteps = '5', a str"),
])
def test_train_in_a_folder_with_a_broken_log_is_one_line(name, data, words, tmp_path, monkeypatch, capsys):
    from pdgym.agents.run_folder import MARKER

    run = tmp_path / "run"
    run.mkdir()
    (run / MARKER).write_text("")
    (run / name).symlink_to("/dev/zero") if data is None else (run / name).write_bytes(data)
    before = sorted(os.listdir(run))
    monkeypatch.chdir(tmp_path)
    train = importlib.import_module("pdgym.agents.training.train").main
    with pytest.raises(SystemExit) as exc:
        train(["total_timesteps=64", "wandb.mode=disabled", f"hydra.run.dir={run}"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exc.value.code == 2 and len(lines) == 1 and lines[0].startswith("pdgym-train: error: resume: "), err
    assert words in lines[0] and name in lines[0], lines[0]
    assert sorted(os.listdir(run)) == before


def test_resumed_wandb_id_and_best_metrics_are_checked(tmp_path, monkeypatch):
    from pdgym.agents.training import run_files

    assert run_files.wandb_id(tmp_path) is None and run_files.best(tmp_path, "ttft_mean") is None
    (tmp_path / "wandb_id.txt").write_text("a1b2c3d4\n")
    (tmp_path / "best_metrics.json").write_text('{"timesteps": 64, "metrics": {"ttft_mean": {"mean": 0.5}}}')
    run_files.check_earlier(tmp_path, "ttft_mean", resuming=True)
    assert run_files.wandb_id(tmp_path) == "a1b2c3d4"
    monkeypatch.setattr(run_files, "MAX_WANDB_ID_BYTES", 16)
    for data, words in [(b"../../x y", "not a wandb run id"), (b"\xff\xfe", "not UTF-8"), (b"a" * 17, "more than")]:
        (tmp_path / "wandb_id.txt").write_bytes(data)
        with pytest.raises(ConfigError, match=words):
            run_files.check_earlier(tmp_path, "ttft_mean", resuming=True)
        run_files.check_earlier(tmp_path, "ttft_mean", resuming=False)  # read only when the run resumes
    (tmp_path / "wandb_id.txt").unlink()
    (tmp_path / "wandb_id.txt").symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="a device"):
        run_files.wandb_id(tmp_path)


# --------------------------------------------------------------------------- a multirun folder in sweep_table
def _sweep(root: Path) -> Path:
    for seed in (0, 1):
        job = root / f"job{seed}"
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- policy/decode=least_kv\n- seed={seed}\n")
        (job / "metrics.json").write_text(json.dumps({"ttft_mean": 0.1 + seed, "imbalance_mean": 2.0}))
    return root


SWEEP = [
    ("overrides_device", lambda j: _link(j / ".hydra" / "overrides.yaml", "/dev/zero"), "a device"),
    ("overrides_big", lambda j: (j / ".hydra" / "overrides.yaml").write_text("- a=1\n" * 400), "more than the"),
    ("overrides_latin1", lambda j: (j / ".hydra" / "overrides.yaml").write_bytes(b"- a=\xe9\n"), "not UTF-8"),
    ("overrides_mapping", lambda j: (j / ".hydra" / "overrides.yaml").write_text("seed: 1\n"), "not the list"),
    ("overrides_tag", lambda j: (j / ".hydra" / "overrides.yaml").write_text("!!python/name:os.system\n"),
     "not valid YAML"),
    ("metrics_device", lambda j: _link(j / "metrics.json", "/dev/zero"), "a device"),
    ("metrics_big", lambda j: (j / "metrics.json").write_text(json.dumps({"ttft_mean": 1, "x": "y" * 2000})),
     "more than the"),
    ("metrics_latin1", lambda j: (j / "metrics.json").write_bytes(b'{"ttft_mean": "\xe9"}'), "not UTF-8"),
    ("metrics_list", lambda j: (j / "metrics.json").write_text("[1, 2]"), "holds a JSON list"),
    ("metrics_text", lambda j: (j / "metrics.json").write_text('{"ttft_mean": "fast"}'), "holds 'fast', not a number"),
    ("metrics_missing", lambda j: (j / "metrics.json").write_text("{}"), "job1/metrics.json has none for ttft_mean"),
]


def test_sweep_table_of_a_multirun_folder(tmp_path, capsys):
    from pdgym.agents.apps import sweep_table

    t = sweep_table.main([str(_sweep(tmp_path)), "ttft_mean"])
    assert list(t.seeds) == [2] and t.ttft_mean[0] == pytest.approx(0.6)
    assert (tmp_path / "sweep_table.csv").is_file()


@pytest.mark.parametrize("case", SWEEP, ids=[c[0] for c in SWEEP])
def test_broken_sweep_job_is_one_line_and_writes_no_table(case, tmp_path, monkeypatch, capsys):
    from pdgym.agents.apps import sweep_table

    _, breaks, words = case
    monkeypatch.setattr(sweep_table, "MAX_OVERRIDES_BYTES", 1024)
    monkeypatch.setattr(sweep_table, "MAX_METRICS_BYTES", 1024)
    breaks(_sweep(tmp_path) / "job1")
    with pytest.raises(SystemExit) as exc:
        sweep_table.main([str(tmp_path), "ttft_mean"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exc.value.code == 2 and len(lines) == 1 and lines[0].startswith("pdgym-table: error: "), err
    assert words in lines[0] and "Traceback" not in err, lines[0]
    assert not (tmp_path / "sweep_table.csv").exists()


# --------------------------------------------------------------------------- fidelity --rejudge reads runs back
RECORD = {"wall_s": 1.5, "error": None, "commit": "abc", "tiny": True, "overrides": []}


def _repro(root: Path, summary: dict | None = None, record: dict | None = None) -> Path:
    d = root / "md1_check"
    d.mkdir(parents=True)
    (d / "fig.png").write_bytes(b"\x89PNG fake")
    (d / "summary.json").write_text(json.dumps(summary or {"rel_err": 0.01, "z": 0.5, "figures": ["fig.png"],
                                                           "regime": {"in_regime": True, "out_of_regime": []}}))
    from pdgym.agents.apps import fidelity

    (d / fidelity.RUN_RECORD).write_text(json.dumps(record or RECORD))
    return d


def test_rejudge_reads_a_run_back(tmp_path, capsys):
    from pdgym.agents.apps import fidelity

    _repro(tmp_path / "runs")
    out = fidelity.run(["md1_check"], False, tmp_path / "runs", tmp_path / "doc" / "f.md", [], rejudge=True)
    assert [e["verdict"] for e in out["effects"]] == ["pass", "pass"]
    assert (tmp_path / "doc" / "f" / "md1_check" / "fig.png").read_bytes() == b"\x89PNG fake"


def _summary(**change) -> dict:
    return {**{"rel_err": 0.01, "z": 0.5, "figures": ["fig.png"]}, **change}


REJUDGE = [
    ("summary_device", lambda d: _link(d / "summary.json", "/dev/zero"), "a device"),
    ("summary_big", lambda d: (d / "summary.json").write_text(json.dumps(_summary(pad="x" * 3000))), "more than the"),
    ("summary_latin1", lambda d: (d / "summary.json").write_bytes(b'{"z": "\xe9"}'), "not UTF-8"),
    ("summary_list", lambda d: (d / "summary.json").write_text("[]"), "holds a JSON list"),
    ("summary_value_text", lambda d: (d / "summary.json").write_text(json.dumps(_summary(z="big"))),
     "has z = big; expected numbers"),
    ("summary_regime_list", lambda d: (d / "summary.json").write_text(json.dumps(_summary(regime=[1]))),
     "has regime = '[1]', a list; expected dict"),
    ("figure_outside", lambda d: (d / "summary.json").write_text(json.dumps(_summary(figures=["../x.png"]))),
     "names the figure '../x.png'"),
    ("figure_absolute", lambda d: (d / "summary.json").write_text(json.dumps(_summary(figures=["/etc/passwd"]))),
     "names the figure '/etc/passwd'"),
    ("figure_device", lambda d: _link(d / "fig.png", "/dev/zero"), "a device"),
    ("record_device", lambda d: _link(d / "fidelity_run.json", "/dev/zero"), "a device"),
    ("record_no_wall", lambda d: (d / "fidelity_run.json").write_text(json.dumps({"error": None})), "has no wall_s"),
    ("record_error_list", lambda d: (d / "fidelity_run.json").write_text(json.dumps(dict(RECORD, error=[1]))),
     "has error = '[1]', a list"),
]


@pytest.mark.parametrize("case", REJUDGE, ids=[c[0] for c in REJUDGE])
def test_broken_run_in_rejudge_is_one_line_and_writes_no_report(case, tmp_path, monkeypatch, capsys):
    from pdgym.agents.apps import fidelity

    _, breaks, words = case
    monkeypatch.setattr(fidelity, "MAX_SUMMARY_BYTES", 2048)
    breaks(_repro(tmp_path / "runs"))
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(SystemExit) as exc:
        fidelity.run(["md1_check"], False, tmp_path / "runs", tmp_path / "doc" / "f.md", [], rejudge=True)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exc.value.code == 2 and len(lines) == 1 and lines[0].startswith("pdgym-fidelity: error: --rejudge: "), err
    assert words in lines[0] and "Traceback" not in err, lines[0]
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_fidelity_doc_that_is_a_device_stops_before_any_run(tmp_path, capsys):
    from pdgym.agents.apps import fidelity

    (tmp_path / "f.md").symlink_to("/dev/zero")
    with pytest.raises(SystemExit) as exc:
        fidelity.run(["md1_check"], True, tmp_path / "runs", tmp_path / "f.md", [])
    assert exc.value.code == 2 and "--doc: " in capsys.readouterr().err and not (tmp_path / "runs").exists()


def test_train_replaces_a_linked_config_and_keeps_the_users_file(tmp_path):
    """An earlier run's folder whose config.yaml is a link to a user's file: the run replaces the link, it never
    writes through it."""
    from pdgym.agents.training.train import train_from_overrides
    from test_agents import SMALL_PPO, TINY

    user = tmp_path / "user.yaml"
    user.write_text("the user's own file\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").symlink_to(user)
    train_from_overrides([*TINY, "agent=maskable_ppo", *SMALL_PPO, "total_timesteps=64", "resume=never"], run)
    assert user.read_text() == "the user's own file\n"
    assert not (run / "config.yaml").is_symlink() and "total_timesteps: 64" in (run / "config.yaml").read_text()


@pytest.mark.parametrize("name", ["progress.csv", "eval_history.csv", "tb", "checkpoints", "wandb"])
def test_train_refuses_a_linked_file_it_writes_in_place(name, tmp_path):
    """SB3's CSV and TensorBoard writers and the history's appends open their files where they are: in an earlier
    run's folder, a link there is refused before anything is written, and what it names is untouched."""
    from pdgym.agents.training.train import train_from_overrides
    from test_agents import SMALL_PPO, TINY

    target = tmp_path / "user"
    folder = name in ("tb", "checkpoints", "wandb")
    target.mkdir() if folder else target.write_text("the user's own file\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / name).symlink_to(target)
    with pytest.raises(ConfigError, match=rf"{name} (is a|leads outside .*\(a) symbolic link"):  # history: its reader
        train_from_overrides([*TINY, "agent=maskable_ppo", *SMALL_PPO, "total_timesteps=64"], run)
    assert (list(target.iterdir()) == []) if folder else target.read_text() == "the user's own file\n"
    assert sorted(p.name for p in run.iterdir()) == [name]


# --------------------------------------------------------------------------- issue 38: hostile stored files
def test_deep_json_is_one_line_in_every_reader(tmp_path):
    """Nested 200,000 deep: json.loads raises RecursionError; every JSON reader bounds the depth first."""
    from pdgym.envs.sim.traces import load_trace

    deep = "[" * 200_000 + "]" * 200_000
    (tmp_path / "a.json").write_text(deep)
    with pytest.raises(ConfigError, match="nests its values too deeply"):
        safe_files.read_json(tmp_path / "a.json", 10 * safe_files.MiB, "k")
    with pytest.raises(ConfigError, match="nests its values too deeply"):
        safe_files.parse_json('{"a": ' * 100 + "1" + "}" * 100, "k")
    assert safe_files.parse_json('{"a": [[1, 2], {"b": "[[[[[["}]}', "k") == {"a": [[1, 2], {"b": "[[[[[["}]}
    row = '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
    (tmp_path / "t.jsonl").write_text(row + '{"timestamp": 1, "input_length": ' + deep + "}\n")
    with pytest.raises(ConfigError, match=r"t.jsonl line 2: nested more than 64 deep") as e:
        load_trace(str(tmp_path / "t.jsonl"), "workload.trace")
    assert "\n" not in str(e.value)


def test_deep_or_foreign_zoo_index_is_one_line(tmp_path):
    from pdgym.agents.evaluation import candidates
    from pdgym.agents.learned import zoo_store as zoo

    (tmp_path / zoo.INDEX).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="zoo index: .* nests its values too deeply"):
        zoo.read_index(tmp_path)
    doc = json.loads((zoo.ROOT / zoo.INDEX).read_text())
    name = next(iter(doc["entries"]))
    doc["entries"][name]["agent"]["env_id"] = "CartPole-v1"
    (tmp_path / zoo.INDEX).write_text(json.dumps(doc))
    (tmp_path / f"{name}.zip").write_bytes((zoo.ROOT / f"{name}.zip").read_bytes())
    with pytest.raises(ConfigError, match=rf"the zoo index entry '{name}' names env_id 'CartPole-v1'"):
        candidates.zoo_agent(name, tmp_path)
    with pytest.raises(ConfigError, match="env.id: unknown 'CartPole-v1'"):
        candidates.env_module("CartPole-v1")


def _manifest(tmp_path: Path, **spec) -> Path:
    good = {"algo": "ppo", "policy": "MlpPolicy", "features": {"kind": "flat"}, "net_arch": [8], "obs_shape": [4],
            "n_actions": 2}
    return _zip(tmp_path / "m.zip", {M.MANIFEST: json.dumps({"format": M.FORMAT, "members": [],
                                                             "spec": dict(good, **spec)})})


@pytest.mark.parametrize("spec, words", [
    ({"obs_shape": [10**12]}, "spec.obs_shape"), ({"obs_shape": [4, 0]}, "spec.obs_shape"),
    ({"obs_shape": "abc"}, "spec.obs_shape"), ({"n_actions": 10**9}, "spec.n_actions"),
    ({"net_arch": "abc"}, "spec.net_arch"), ({"net_arch": [10**9]}, "spec.net_arch"), ({"algo": "evil"}, "spec.algo"),
])
def test_manifest_spec_out_of_bounds_is_one_line_before_any_network(spec, words, tmp_path):
    """A manifest's obs_shape of 10^12 allocated 931 GiB building the network; each key is checked first."""
    with pytest.raises(M.ModelFileError, match=re.escape(words)) as e:
        M.read(_manifest(tmp_path, **spec))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("out, words", [("missing/c.png", "does not exist"), ("folder", "is a folder"),
                                        ("c.txt", "allowed: .png")])
def test_curves_out_that_cannot_be_a_figure_is_one_line(out, words, tmp_path, capsys):
    runs = [_train_run(tmp_path / "src", "a")]
    (tmp_path / "folder").mkdir()
    code, lines, err = _curves([*map(str, runs), "--out", str(tmp_path / out)], capsys)
    assert code == 2 and len(lines) == 1 and "--out: " in lines[0] and words in lines[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "src"] and not (runs[0] / "curves.png").exists()
    assert list((tmp_path / "folder").iterdir()) == []


def test_curves_and_sweep_table_never_write_through_a_link(tmp_path, capsys):
    """Links at curves.png, --out, sweep_table.csv and their old fixed temporaries: replaced, never written through."""
    from pdgym.agents.apps import sweep_table
    from pdgym.agents.training import curves

    user = tmp_path / "user"
    user.mkdir()
    run = _train_run(tmp_path, "a")
    sweep = _sweep(tmp_path / "sweep")
    names = [run / "curves.png", run / ".curves.png.partial.png", tmp_path / "c.png", tmp_path / ".c.png.partial.png",
             sweep / "sweep_table.csv", sweep / ".sweep_table.csv.partial.csv"]
    for i, n in enumerate(names):
        (user / f"f{i}").write_text(f"user file {i}\n")
        n.symlink_to(user / f"f{i}")
    curves.main([str(run), "--out", str(tmp_path / "c.png")])
    sweep_table.main([str(sweep), "ttft_mean"])
    capsys.readouterr()
    assert all((user / f"f{i}").read_text() == f"user file {i}\n" for i in range(len(names)))
    for n in (run / "curves.png", tmp_path / "c.png", sweep / "sweep_table.csv"):
        assert not n.is_symlink() and n.stat().st_size > 0


def test_user_policy_constructor_error_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    from pdgym.agents.apps import sim

    (tmp_path / "mypol.py").write_text(
        "from pdgym.envs.sim.policy import DecodeRouter\n"
        "class Bad(DecodeRouter):\n"
        "    def __init__(self):\n"
        "        raise ValueError('bad init')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for full in ("0", "1"):
        monkeypatch.setenv("HYDRA_FULL_ERROR", full)
        with pytest.raises(SystemExit) as exc:
            sim.main(["policy.decode=mypol:Bad", "workload.num_requests=20", f"hydra.run.dir={tmp_path / 'run'}"])
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert exc.value.code == 2 and last.startswith("pdgym-sim: error: policy.decode.name: mypol:Bad()")
        assert "ValueError: bad init" in last and not (tmp_path / "run").exists()
        assert ("Traceback" in err and "raise ValueError('bad init')" in err) == (full == "1"), err


# --------------------------------------------------------------------------- resume keeps the whole log (#38 item 4)
def test_resumed_progress_log_keeps_the_rows_up_to_the_checkpoint(tmp_path):
    from pdgym.agents.training import run_files

    (tmp_path / "progress.csv").write_text(
        "time/total_timesteps,rollout/ep_rew_mean\n64,-3.0\n,-2.9\n128,-2.5\n192,-2.0\n,-1.9\n256,-1")
    w = run_files.progress_writer(tmp_path, 128)  # the checkpoint held step 128: 192, 256 were past it
    w.write({"time/total_timesteps": 192, "rollout/ep_rew_mean": -1.5, "train/loss": 0.1}, {}, 192)
    w.close()
    df = run_files.progress(tmp_path)
    assert list(df[run_files.STEP_COL].fillna(-1)) == [64, -1, 128, 192]  # -1: the evaluation's row, kept
    assert list(df[run_files.RETURN_COL]) == [-3.0, -2.9, -2.5, -1.5] and df["train/loss"].iloc[-1] == 0.1
    fresh = run_files.progress_writer(tmp_path, None)  # a fresh run starts the log empty
    fresh.close()
    assert (tmp_path / "progress.csv").read_text() == ""


def test_checkpoints_after_a_resume_are_named_by_their_step(tmp_path):
    """Restored at step 2048, checkpoint_freq 2048: the next checkpoint is model_4096.zip (it was model_2049)."""
    from pdgym.agents.training.callbacks import CheckpointEvery

    class Model:
        num_timesteps, logger = 2048, None

        def get_env(self):
            return None

    saved = []
    cb = CheckpointEvery(2048, tmp_path, lambda model, path, training=False: saved.append(path.name) or path)
    model = Model()
    cb.init_callback(model)
    for step in (2049, 3000, 4095, 4096, 5000):
        model.num_timesteps = step
        cb.on_step()
    assert saved == ["model_4096.zip"]


def test_train_rerun_never_writes_through_a_link_at_a_name_it_wrote(tmp_path):
    """A training run, then links to user files at every name it wrote that a resume replaces (and at every
    name's old fixed temporary), then a resume=auto into the folder: not one byte reaches a user file."""
    from pdgym.agents.training.train import train_from_overrides
    from test_agents import SMALL_PPO, TINY

    run, user = tmp_path / "run", tmp_path / "user"
    args = [*TINY, "agent=maskable_ppo", *SMALL_PPO, "total_timesteps=64", "checkpoint_freq=64"]
    train_from_overrides(args, run)
    written = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())
    read_back = ("agent.json", "best_metrics.json", "eval_history.csv", "progress.csv", "wandb_id.txt",
                 "best_model.zip", "checkpoints/", "tb/")  # read or written in place: their links are refused
    names = [n for n in written if not n.startswith(read_back)]
    assert {"config.yaml", "metrics.json", "final_model.zip", "curves.png"} <= set(names), written
    temporaries = [str(Path(n).with_name(f".{Path(n).name}.partial{Path(n).suffix}")) for n in written]
    user.mkdir()
    targets = {}
    for i, n in enumerate(names + temporaries):
        (user / f"f{i}").write_text(f"user file {i}\n")
        (run / n).unlink(missing_ok=True)
        (run / n).symlink_to(user / f"f{i}")
        targets[user / f"f{i}"] = f"user file {i}\n"
    train_from_overrides([*args, "resume=auto"], run)
    assert {t: t.read_text() for t in targets} == targets
    assert not any((run / n).is_symlink() for n in names)


def test_damaged_checkpoints_alone_print_nothing_before_the_error(tmp_path, capsys):
    """With no whole checkpoint the caller's one error line is all: no 'skipping' lines before it; with one, the
    damaged newer ones are named."""
    for step in (64, 128):
        (tmp_path / f"model_{step}.zip").write_bytes(b"not a zip")
    assert M.latest_complete(tmp_path) is None and capsys.readouterr().err == ""
    M.write_atomic(tmp_path / "model_32.zip", {M.MANIFEST: json.dumps({"format": M.FORMAT, "members": []}).encode()})
    assert M.latest_complete(tmp_path).name == "model_32.zip"
    assert capsys.readouterr().err.count("skipping damaged checkpoint") == 2
