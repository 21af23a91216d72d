"""Podman for the container tests, as these machines run it (``scripts/setup --test``
installs it from Debian): runc, cgroupfs, host networking (the emulators are on the
host's loopback), and rlimits the sandbox lets runc set on every container (podman's
defaults raise them, which it refuses: "error setting rlimit type 7"). The store is under
``.deps/podman/<driver>`` (images kept from one run to the next): the overlay storage
driver where the kernel mounts overlays (a layer holds only what its step changed), vfs
where it does not (every layer a full copy of the file system: with every step's layer
kept, 6.1 GiB, which once filled a CI machine's disk mid-build; so with vfs no step's
layer is kept and each image's own layers are squashed into one). What the three
images' builds (run, serve, full) take on an empty store, measured: overlay 3.1 GiB
kept, 4.9 GiB at the builds' peak (full's, pyspark's sdist unpacked and installed); vfs
5.4 GiB kept, 9.3 GiB at the peak (full's again: with vfs it shares no layer with run).
A build says beforehand when the disk has less room than that. ``MLDSERVER_PODMAN_DRIVER=vfs`` runs the tests as a machine without
overlays does::

    podman = Podman(deps_dir() / "podman")
    image = podman.build("serve")            # deploy/Containerfile --target serve
    podman("run", "--rm", image, "--version")

No container registry is reachable here, so the Containerfile's ``BASE`` (a Debian
bookworm image with python3 and its venv module; ``python:3.11-slim-bookworm`` where
registries are) is made from Debian's packages: ``debootstrap --variant=minbase``,
imported once as ``localhost/mldserver-base:bookworm``. A build reaches PyPI and
Debian through the host's network; where the host trusts a CA of its own (a proxy's),
the build's steps are given it (``SSL_CERT_FILE``: mounted, and named in a pip.conf).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import time
from pathlib import Path

from ..harness import ROOT

BASE = "localhost/mldserver-base:bookworm"
MIRROR = "http://deb.debian.org/debian"
UID = 10001  # the image's user (deploy/Containerfile)
# The image user's processes and threads (the JVM's among them): plenty, and under what
# the sandbox lets runc set (its own 96,365 is refused above 32,768).
NPROC = 4096
# The room the three images' builds take at their peak, measured (overlay 4.9 GiB, vfs
# 9.3 GiB), and a little more: a build that would fit must not be refused.
NEEDS = {"overlay": int(5.5 * 2**30), "vfs": int(10.0 * 2**30)}


class Podman:
    def __init__(self, root: Path) -> None:
        if shutil.which("podman") is None:
            raise AssertionError("podman is not installed: run scripts/setup --test (Debian's podman and runc)")
        self.root = root = root.resolve()
        root.mkdir(parents=True, exist_ok=True)
        self.driver = os.environ.get("MLDSERVER_PODMAN_DRIVER") or ("overlay" if _overlay(root) else "vfs")
        self.argv = _argv(root, self.driver)
        self._roomy = False  # room() passed: the images' builds fit
        soft, hard = map(_limit, resource.getrlimit(resource.RLIMIT_NOFILE))
        self.limits = [f"--ulimit=nofile={soft}:{hard}", f"--ulimit=nproc={NPROC}:{NPROC}"]

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([*self.argv, *args], capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args[:3])} ... exited {done.returncode}: {done.stderr[-3000:]}")
        return done

    def run(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        """``podman run`` with host networking and this process's rlimits."""
        return self("run", "--network", "host", *self.limits, *args, **kwargs)

    def exists(self, image: str) -> bool:
        return self("image", "exists", image, check=False).returncode == 0

    def base(self) -> str:
        """``BASE``, made from Debian's packages the first time (some 40 s), kept."""
        if not self.exists(BASE):
            tar = self.root / "base.tar"
            if not tar.exists():
                _debootstrap(self.root / "rootfs", tar)
            self("import", str(tar), BASE, timeout=600)
        return BASE

    def build(self, target: str, tag: str | None = None) -> str:
        """The image of ``deploy/Containerfile``'s ``target`` from this checkout, built
        on ``BASE``, docker format (HEALTHCHECK kept); its tag."""
        tag = tag or f"localhost/mldserver-{target}:test"
        if not self._roomy and not self.exists(tag):  # (a built image's layers are kept)
            self.room()
        trust: list[str] = []
        ca = os.environ.get("SSL_CERT_FILE")
        if ca and Path(ca).is_file():
            pip_conf = self.root / "pip.conf"
            pip_conf.write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
            trust = ["-v", f"{ca}:/etc/ssl/certs/ca-certificates.crt:ro", "-v", f"{pip_conf}:/etc/pip.conf:ro"]
        # vfs copies the whole file system into every layer: no step's layer is kept for
        # the next build, and the image's own layers are squashed into one
        lean = ["--squash"] if self.driver == "vfs" else []  # (--squash: no layer cache either)
        self("build", "--format", "docker", "--network", "host", *self.limits, *trust, *lean,
             "--build-arg", f"BASE={self.base()}", "-f", str(ROOT / "deploy" / "Containerfile"),
             "--target", target, "-t", tag, str(ROOT), timeout=1800)
        if lean:
            self("image", "prune", "--force")  # the build stages' images
        return tag

    def room(self) -> None:
        """Fail before the first build when the store's disk has less free space than
        the three images take with this driver, saying so (podman would fail mid-build
        with "no space left on device", after minutes)."""
        free = shutil.disk_usage(self.root).free
        if free < NEEDS[self.driver]:
            raise AssertionError(
                f"{free / 2**30:.1f} GiB free on the disk of {self.root}: building the images with podman's "
                f"{self.driver} storage driver takes some {NEEDS[self.driver] / 2**30:.1f} GiB; free some space "
                f"(an old store under {self.root} can go: rm -r {self.root})")
        self._roomy = True

    def size(self, image: str) -> int:
        return int(self("image", "inspect", "--format", "{{.Size}}", image).stdout)

    def inspect(self, container: str, template: str) -> str:
        return self("inspect", "--format", template, container).stdout.strip()

    def stop(self, container: str, timeout: int) -> int:
        """``podman stop``: SIGTERM to PID 1, SIGKILL after ``timeout`` s; the exit code."""
        self("stop", "-t", str(timeout), container, timeout=timeout + 60)
        return int(self.inspect(container, "{{.State.ExitCode}}"))

    def wait_running(self, container: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.inspect(container, "{{.State.Status}}") != "running":
            if time.monotonic() > deadline:
                raise AssertionError(f"{container} is not running: {self('logs', container).stderr[-3000:]}")
            time.sleep(0.2)


def _argv(root: Path, driver: str) -> list[str]:
    """podman with its store under ``root / driver`` (podman's database keeps the paths
    and the driver it was first given: the same every run)."""
    store = root / driver
    return ["podman", "--root", str(store / "storage"), "--runroot", str(store / "run"), "--storage-driver", driver,
            "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]


def _overlay(root: Path) -> bool:
    """Can podman use the overlay driver here? It mounts a test overlay when it starts
    on a new store, and refuses where the kernel or the file system under ``root``
    cannot."""
    done = subprocess.run([*_argv(root, "overlay"), "info", "--format", "{{.Store.GraphDriverName}}"],
                          capture_output=True, text=True, timeout=120)
    return done.returncode == 0 and done.stdout.strip() == "overlay"


def _limit(value: int) -> str:
    return "-1" if value == resource.RLIM_INFINITY else str(value)


def _debootstrap(rootfs: Path, tar: Path, attempts: int = 3) -> None:
    """The base's root file system from Debian's packages, as a tar. debootstrap does
    not retry a download that fails (a CI run once lost one): each attempt starts
    afresh, and the last one's output says why."""
    if shutil.which("debootstrap") is None:
        raise AssertionError("debootstrap is not installed: run scripts/setup --test")
    for attempt in range(1, attempts + 1):
        shutil.rmtree(rootfs, ignore_errors=True)
        done = subprocess.run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
                               "bookworm", str(rootfs), MIRROR], capture_output=True, text=True, timeout=1200)
        if done.returncode == 0:
            break
        log = rootfs / "debootstrap" / "debootstrap.log"
        detail = (done.stdout + done.stderr)[-2000:] + (log.read_text(errors="replace")[-2000:] if log.exists() else "")
        if attempt == attempts:
            raise AssertionError(f"debootstrap failed {attempts} times, the last with {done.returncode}: {detail}")
        print(f"debootstrap attempt {attempt} failed ({done.returncode}), trying again: {detail[-500:]}")
    for junk in (rootfs / "var" / "cache" / "apt" / "archives").glob("*.deb"):
        junk.unlink()
    partial = tar.with_suffix(".partial")
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True, timeout=600)
    partial.rename(tar)
    shutil.rmtree(rootfs)
