"""The lock is what runs: requirements.lock pins every package pyproject.toml asks for (all
extras the Makefile installs, and the build requirements) to one exact version, and the
environment running these tests holds exactly the locked versions (make venv installs
through it). A dependency added without `make lock`, or a venv that drifted, fails here."""

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (the lock's Python)

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"


def _name(requirement: str) -> str:
    """PEP 503 name of a requirement string ('mlx[cpu]==0.32.4; ...' -> 'mlx')."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def _locked() -> dict:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[_name(name)] = version
    return pins


def _requirements() -> list:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = list(project["project"]["dependencies"]) + list(project["build-system"]["requires"])
    for extra in project["project"]["optional-dependencies"].values():
        reqs += extra
    return reqs


def test_every_requirement_is_pinned_in_the_lock():
    pins = _locked()
    missing = sorted({_name(r) for r in _requirements() if "sys_platform != 'linux'" not in r}
                     - set(pins))
    assert not missing, f"not in requirements.lock (run make lock): {missing}"


def test_the_lock_pins_one_exact_version_per_line():
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            assert re.fullmatch(r"[a-z0-9-]+==[0-9][0-9A-Za-z.]*", line), line


@pytest.mark.skipif(Path(sys.prefix).name == ".venv-latest",
                    reason="make test-latest runs on the newest releases on purpose")
def test_the_running_environment_holds_the_locked_versions():
    pins, drift = _locked(), []
    for dist in metadata.distributions():
        name = _name(dist.metadata["Name"])
        if name in pins and dist.version.split("+")[0] != pins[name]:
            drift.append(f"{name} {dist.version} (lock: {pins[name]})")
    assert not drift, f"installed versions differ from requirements.lock: {drift}"
