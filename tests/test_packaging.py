"""The distribution: a built wheel carries every module, config and trace, and works without the repo."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPING = {"pdgym": "pdgym", "envs": "pdgym/envs", "baselines": "pdgym/baselines", "agents": "pdgym/agents",
           "conf": "pdgym/conf", "data": "pdgym/data"}


def build_wheel(out: Path) -> Path:
    shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools would reuse stale files from it
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(out), str(ROOT)], check=True, capture_output=True, timeout=300)
    return next(out.glob("pdgym-*.whl"))


def test_wheel_contains_every_module_config_trace_and_zoo_agent(tmp_path):
    names = set(zipfile.ZipFile(build_wheel(tmp_path)).namelist())
    expected = []
    for src, dst in MAPPING.items():
        for f in (ROOT / src).rglob("*"):
            shipped = ((src == "data" and f.suffix in (".csv", ".jsonl"))
                       or (f.parent.name == "zoo" and f.suffix in (".zip", ".json")))  # the zoo's agents and index
            if (f.suffix in (".py", ".yaml") or shipped) and "__pycache__" not in f.parts:
                expected.append(f"{dst}/{f.relative_to(ROOT / src).as_posix()}")
    missing = [e for e in expected if e not in names]
    assert not missing, f"not in the wheel: {missing[:10]}"


def test_wheel_runs_without_the_repository(tmp_path):
    wheel = build_wheel(tmp_path)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    deps = sysconfig.get_paths()["purelib"]
    code = (
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
        "import pdgym.envs.sim as s, pdgym.baselines as b\n"
        "from pdgym.envs.scenario import load_scenario\n"
        "assert s.__file__.startswith(sys.argv[1]), s.__file__\n"
        "sc = load_scenario('md1_single_slot', ['workload.num_requests=50'])\n"
        "r = s.simulate(sc.sim, b.make_policies(sc.policy), seed=0)\n"
        "assert r.summary()['finished'] == 50\n"
        "from pdgym.envs.sim.traces import load_trace\n"
        "assert len(load_trace('azure_conv')) == 19366\n"
        "from pdgym.agents.learned import zoo_store as zoo\n"
        "assert str(zoo.ROOT).startswith(sys.argv[1]) and zoo.archive('prefix_mooncake').is_file(), zoo.ROOT\n"
        "print('ok')\n"
    )
    # -S: no site processing, so the editable install's import hook cannot shadow the wheel.
    p = subprocess.run([sys.executable, "-S", "-c", code, str(site), deps], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300, check=False)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr[-2000:]


def test_building_prints_no_setuptools_warnings(tmp_path):
    """Licence as an SPDX string, config / trace folders declared: no deprecation or 'ambiguous package' warning."""
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w",
                        str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300, check=True)
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    out = r.stdout + r.stderr
    assert "running bdist_wheel" in out or "Building wheel" in out  # -v shows the backend's output
    for bad in ("BuildBackendWarning", "SetuptoolsDeprecationWarning", "ambiguous", "is deprecated"):
        assert bad not in out, [ln for ln in out.splitlines() if bad in ln][:3]
