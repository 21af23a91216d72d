"""A release is one command away, and what it makes is what a user installs:
``scripts/release`` builds the sdist, then the wheel *from that sdist* (so the sdist
carries everything the native parts are built from), and ``twine check --strict``
passes on both. The wheel holds the native parts (the relay, an executable; ``_scan``,
``_b64``, ``_emitted``, ``_gather``), and installed on its own, away from the checkout, it
runs ``mldserver check`` on the shipped example handler with the native parts loaded.

Built from a copy of the tracked files (as a fresh clone has them), with the project's
own virtualenv and no build isolation, so nothing is downloaded while testing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from .harness import ROOT

NATIVE = ("mldserver/protocol/_scan", "mldserver/pool/_b64", "mldserver/rows/_emitted", "mldserver/coordinator/_gather")


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("checkout")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    (tree / ".venv").symlink_to(Path(sys.prefix))
    out = tree / "dist"
    done = subprocess.run(["scripts/release", "--outdir", str(out), "--no-isolation"], cwd=tree,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("PASSED") == 2, done.stdout[-2000:]
    return out


def test_the_sdist_carries_the_native_sources_and_the_docs(dist: Path) -> None:
    (sdist,) = dist.glob("mldserver-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    for source in ("mldserver/ops/relay.c", "mldserver/protocol/_cursor.h", "mldserver/protocol/_check.h", "setup.py", "pyproject.toml",
                   "README.md", "CHANGELOG.md", "mldserver/base/events.toml", *(f"{stem}.c" for stem in NATIVE)):
        assert source in names, f"{source} is not in {sdist.name}"


def test_the_wheel_holds_the_native_parts(dist: Path) -> None:
    (wheel,) = dist.glob("mldserver-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        infos = {info.filename: info for info in zf.infolist()}
    relay = infos.get("mldserver/ops/mldserver-relay")
    assert relay is not None, "the native relay is not in the wheel"
    assert "mldserver/base/events.toml" in infos, "the log-event catalogue is not in the wheel"
    assert (relay.external_attr >> 16) & 0o111, "the relay is in the wheel but not executable"
    for stem in NATIVE:
        assert any(name.startswith(stem) and name.endswith(".so") for name in infos), f"{stem} was not built"
    metadata = next(name for name in infos if name.endswith(".dist-info/METADATA"))
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(metadata).decode()
    for extra in ("spark", "iceberg", "kcl", "kclpy", "all"):
        assert f"Provides-Extra: {extra}" in text


def test_the_installed_wheel_runs_away_from_the_checkout(dist: Path, tmp_path: Path) -> None:
    (wheel,) = dist.glob("mldserver-*.whl")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--target", str(target), str(wheel)], check=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = ("import mldserver, mldserver.protocol._scan, mldserver.pool._b64, mldserver.rows._emitted,"
             " mldserver.coordinator._gather;"
             "print(mldserver.__file__)")
    where = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(target), where
    checked = subprocess.run(
        [sys.executable, "-m", "mldserver", "check", "--handler", "mldserver.examples.quickstart:Orders",
         "--sink", f"file:{tmp_path / 'windows'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "(writable)" in checked.stdout, checked.stdout
