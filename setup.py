"""The one setting pyproject.toml cannot compute: the package list, found instead of listed.

pyproject.toml maps each top-level folder to its package (`[tool.setuptools] package-dir`: envs -> pdgym.envs, conf
-> pdgym.conf, ...); `packages()` adds every folder below them with setuptools' `find_namespace_packages`, so a new
conf/ group folder (conf/policy/<point>/, ...) or code sub-package ships without being listed: the data folders are
namespace packages whose files `[tool.setuptools.package-data]`'s globs pick. Listing them all (rather than shipping
them as data of their parent) keeps setuptools from warning that an importable folder is "installed as data".
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, setup

HERE = Path(__file__).resolve().parent


def packages() -> list[str]:
    """Each package of pyproject.toml's package-dir and every folder below it (caches and build output aside)."""
    dirs = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = []
    for name, folder in dirs.items():
        subs = find_namespace_packages(where=str(HERE / folder), exclude=["__pycache__", "*.__pycache__"])
        found += [name, *(f"{name}.{sub}" for sub in subs)]
    return found


if __name__ == "__main__":
    setup(packages=packages())
