"""Interrupted runs leave nothing that looks like a result (SIGINT and SIGKILL, while simulating and writing).

A complete pdgym-sim result is marked by metrics.json, written last; tables are written to a temporary
name and renamed. pdgym-repro moves the previous run aside, so its summary.json never stands as this run's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pdgym.agents.run_folder import MARKER

BIN = Path(sys.executable).parent
LONG = ["scenario=ds_v3_h800_3p1d", "workload.num_requests=300000", "plots=false"]
# pdgym-sim whose table writer opens its temporary, writes the header and then hangs in its first chunk of rows
# (metrics.write_csv formats each chunk's cells with _csv_strings): the signal lands in the middle of a write.
SLOW_WRITER = """
import sys, time
from pdgym.envs.sim import metrics
def slow(col):
    time.sleep(120)
metrics._csv_strings = slow
from pdgym.agents.apps.sim import main
main(sys.argv[1:])
"""


def _wait_for(cond, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "the run never reached the point to interrupt"
        time.sleep(0.1)


def _interrupt(cmd: list[str], ready, sig: int, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # a suite started in the background of a non-interactive shell inherits SIGINT ignored, and so would the
        # child (Python then never raises KeyboardInterrupt); a handled SIGINT is reset to default across exec
        signal.signal(signal.SIGINT, signal.default_int_handler)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    try:
        _wait_for(lambda: ready() or p.poll() is not None)
        assert p.poll() is None, p.stderr.read()
        p.send_signal(sig)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _no_complete_result(out: Path) -> None:
    assert not (out / "metrics.json").exists()
    # a table under its final name is whole (renamed after writing), never a truncated one
    for name in ("requests.csv", "steps.csv"):
        assert not (out / name).exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_sim_interrupted_while_simulating(tmp_path, sig):
    out = tmp_path / "run"
    r = _interrupt([str(BIN / "pdgym-sim"), *LONG, f"hydra.run.dir={out}"],
                   lambda: (out / ".hydra").exists() and time.sleep(1.5) is None, sig, tmp_path)
    _no_complete_result(out)
    if sig == signal.SIGINT:
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 130 and "Traceback" not in r.stderr
        assert "interrupted" in lines[-1] and "no result" in lines[-1]
    else:
        assert r.returncode == -signal.SIGKILL


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_sim_interrupted_while_writing(tmp_path, sig):
    out = tmp_path / "run"

    def partial() -> bool:  # the writer's temporary: a fresh name per write (safe_files.atomic_path)
        return any(out.glob(".requests.csv.*.partial.csv"))

    r = _interrupt([sys.executable, "-c", SLOW_WRITER, "scenario=ds_v3_h800_3p1d", "workload.num_requests=200",
                    "plots=false", f"hydra.run.dir={out}"], partial, sig, tmp_path)
    _no_complete_result(out)
    if sig == signal.SIGINT:
        assert r.returncode == 130 and "Traceback" not in r.stderr
        assert not partial()  # the temporary file is cleaned up
    else:
        assert partial()  # left behind, but under a name no reader takes for a result


def test_repro_interrupted_keeps_the_previous_run_whole(tmp_path):
    prev = tmp_path / "runs/repro/md1_check"
    prev.mkdir(parents=True)
    (prev / "summary.json").write_text('{"previous": true}\n')
    (prev / MARKER).write_text("")  # a run of pdgym's (a user's folder of that name is never replaced)
    partial = tmp_path / "runs/repro/md1_check.partial"
    r = _interrupt([str(BIN / "pdgym-repro"), "md1_check", "repro.num_requests=3000000", "repro.max_requests=3000000",
                    "repro.rhos=[0.5]", "repro.rho=0.5"],
                   lambda: partial.exists() and time.sleep(1.5) is None, signal.SIGINT, tmp_path)
    assert r.returncode == 130 and "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if "it/s]" not in ln]  # the progress bar aside
    assert len(lines) == 1 and lines[0].startswith("pdgym-repro: error: interrupted")
    assert not partial.exists()  # the interrupted run's files are gone
    assert (prev / "summary.json").read_text() == '{"previous": true}\n'  # the last complete run stands
    assert not (tmp_path / "runs/repro/md1_check.previous").exists()


# Ctrl-C while an app starts (imports, composing, validating: seconds before its run): one line, exit 130, no
# traceback and no "Exception ignored" block (it was 32-42 lines), and no run folder claiming a run.
STARTUP = {"pdgym-sim": [*LONG], "pdgym-eval": ["policy=br0", "scenario=decode_tier_n16", "progress=false"],
           "pdgym-train": ["total_timesteps=100000", "progress=false", "wandb.mode=disabled"],
           "pdgym-repro": ["md1_check"]}


@pytest.mark.parametrize("delay", [0.2, 0.6, 1.2])
@pytest.mark.parametrize("app", sorted(STARTUP))
def test_ctrl_c_during_start_up_is_one_line_exit_130(app, delay, tmp_path):
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as _interrupt: let the child see SIGINT
    out = tmp_path / "run"
    where = [] if app == "pdgym-repro" else [f"hydra.run.dir={out}"]
    p = subprocess.Popen([str(BIN / app), *STARTUP[app], *where], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=tmp_path)
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    lines = [ln for ln in err.splitlines() if ln.strip() and "it/s]" not in ln]
    assert p.returncode == 130, err
    assert len(lines) == 1 and lines[0].startswith(f"{app}: error: interrupted"), err
    assert "Traceback" not in err and "Exception ignored" not in err
    for name in ("metrics.json", "summary.json", "agent.json", "config.yaml"):
        assert not (out / name).exists()


def test_an_error_a_ctrl_c_left_in_a_library_cleanup_is_still_the_ctrl_c(capsys):
    """A cleanup that fails on the half-built state an interrupt left (seen once in OmegaConf's flag_override during
    pdgym-eval's start-up) replaces the KeyboardInterrupt with its own error: still one line and exit 130; an
    error with no interrupt behind it stays an error."""
    from pdgym.agents.errors import interrupted, one_line_errors

    def cleanup_fails():
        try:
            raise KeyboardInterrupt
        finally:
            raise AttributeError("half-built node")  # noqa: B012 (the library's bug being modelled)

    with pytest.raises(AttributeError) as info:
        cleanup_fails()
    assert interrupted(info.value) and not interrupted(AttributeError("plain")) and not interrupted(None)
    with pytest.raises(SystemExit) as stop:
        one_line_errors("pdgym-x")(cleanup_fails)()
    assert stop.value.code == 130
    assert capsys.readouterr().err.strip().startswith("pdgym-x: error: interrupted")
    with pytest.raises(AttributeError):
        one_line_errors("pdgym-x")(lambda: (_ for _ in ()).throw(AttributeError("plain")))()


def test_a_ctrl_c_inside_hydras_composition_is_still_the_ctrl_c(capsys, monkeypatch):
    """CI saw `pdgym-sim: error: root.handlers: ConfigCompositionException`, exit 2, for a Ctrl-C at start-up:
    OmegaConf's cleanup failed on the config the interrupt left half-built, and Hydra wrapped that error in its
    own (`raise ConfigCompositionException() from e`). The composition's error line is the interrupt's, 130;
    the same error without an interrupt behind it stays a one-line error, exit 2."""
    import hydra
    from hydra.errors import ConfigCompositionException
    from omegaconf.errors import ConfigKeyError
    from pdgym.agents.compose import compose_checked

    def composed(interrupt: bool):
        def compose(*args, **kwargs):
            try:
                try:
                    if interrupt:
                        raise KeyboardInterrupt
                finally:
                    raise ConfigKeyError("root.handlers")  # noqa: B012 (OmegaConf's flag_override cleanup)
            except ConfigKeyError as exc:  # Hydra's load_configuration
                raise ConfigCompositionException() from exc
        return compose

    monkeypatch.setattr(hydra, "compose", composed(True))
    with pytest.raises(SystemExit) as stop:
        compose_checked("pdgym-x", "config", [])
    assert stop.value.code == 130 and capsys.readouterr().err.startswith("pdgym-x: error: interrupted")
    monkeypatch.setattr(hydra, "compose", composed(False))
    with pytest.raises(SystemExit) as stop:
        compose_checked("pdgym-x", "config", [])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "interrupted" not in err


# an app whose import loses the Ctrl-C, as CPython does when the KeyboardInterrupt is raised in Python code a C
# function calls and clears the error of (the CI failure of 2026-11-27: Ctrl-C at 0.6 s, the whole run, exit 0)
LOSES_THE_CTRL_C = """
import pathlib, time
pathlib.Path("importing").write_text("")
try:
    time.sleep(60)
except KeyboardInterrupt:
    pass  # lost
def main():
    pathlib.Path("ran").write_text("")
"""


def test_a_ctrl_c_lost_during_the_imports_still_stops_the_app(tmp_path):
    (tmp_path / "loses_ctrl_c.py").write_text(LOSES_THE_CTRL_C)
    cmd = [sys.executable, "-c", "from pdgym.agents.apps.launch import launch; launch('pdgym-x', 'loses_ctrl_c')"]
    r = _interrupt(cmd, (tmp_path / "importing").exists, signal.SIGINT, tmp_path,
                   env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 130 and r.stderr.strip().splitlines() == [
        "pdgym-x: error: interrupted; this run wrote no result"], r.stderr
    assert not (tmp_path / "ran").exists()


def test_the_latch_remembers_a_swallowed_ctrl_c_and_forgets_it_after():
    from pdgym.agents import interrupts

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as an app's process has it
    try:
        with interrupts.latched():
            interrupts.raise_if_interrupted()  # nothing arrived: no raise
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
            except KeyboardInterrupt:
                pass  # swallowed, as CPython may
            with pytest.raises(KeyboardInterrupt):
                interrupts.raise_if_interrupted()
        interrupts.raise_if_interrupted()  # forgotten once the app is done
    finally:
        signal.signal(signal.SIGINT, before)


# a Ctrl-C that lands in a finaliser is "unraisable": Python would print it and go on
IN_A_FINALISER = """
import pathlib, time
class Finaliser:
    def __del__(self):
        raise KeyboardInterrupt
def main():
    Finaliser()
    for _ in range(200):
        time.sleep(0.05)
    pathlib.Path("ran").write_text("")
"""


def test_a_ctrl_c_in_a_finaliser_stops_the_app_in_one_line(tmp_path):
    (tmp_path / "in_finaliser.py").write_text(IN_A_FINALISER)
    r = subprocess.run([sys.executable, "-c", "from pdgym.agents.apps.launch import launch; launch('pdgym-x', 'in_finaliser')"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)}, check=False)
    assert r.returncode == 130 and r.stderr.strip().splitlines() == [
        "pdgym-x: error: interrupted; this run wrote no result"], r.stderr
    assert not (tmp_path / "ran").exists()
