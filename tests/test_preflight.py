"""Start-up checks of the machine: the state directory takes a file, and binding
``--unix`` takes nothing from anyone (only a stale socket is removed)."""

from __future__ import annotations

import multiprocessing
import socket
from pathlib import Path

import pytest

from mldserver.errors import ConfigError
from mldserver.base.config import Settings
from mldserver.server.preflight import free_unix_path, probe_path, writable_sink, writable_state_dir


def test_a_missing_state_dir_is_created_and_probed_leaving_nothing_behind(tmp_path):
    path = tmp_path / "a" / "state"
    assert writable_state_dir(path) == path
    assert path.is_dir() and not any(path.iterdir())


def test_a_state_dir_that_is_a_regular_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "state"
    path.write_text("not a directory\n")
    with pytest.raises(ConfigError) as caught:
        writable_state_dir(path)
    assert str(caught.value) == (f"--state-dir {path}: exists and is not a directory: "
                                 "remove it or choose another --state-dir")


def _probe_often(path: str, times: int) -> None:
    for _ in range(times):
        writable_state_dir(Path(path))


def test_processes_that_probe_one_state_dir_at_once_do_not_unlink_each_others_probe(tmp_path):
    """CI saw ``check`` refuse a good state dir while another ``check`` probed it: both
    wrote one probe name, and the second unlink found nothing (No such file or directory)."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        pool.starmap(_probe_often, [(str(tmp_path), 300)] * 2)
    assert not any(tmp_path.iterdir())


def test_a_state_dir_that_cannot_be_created_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"^--state-dir /proc/mldserver-state: cannot create it \(.+\): "):
        writable_state_dir(Path("/proc/mldserver-state"))


def test_a_state_dir_that_takes_no_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "state"
    probe_path(path).mkdir(parents=True)  # the probe's name is taken by a folder: its write fails
    with pytest.raises(ConfigError, match=rf"^--state-dir {path}: cannot write there \(Is a directory\)"):
        writable_state_dir(path)


def test_a_sink_that_cannot_be_written_is_refused_naming_it(tmp_path):
    out = tmp_path / "out"
    assert writable_sink(Settings(sink=f"file:{out}")) == out and out.is_dir() and not any(out.iterdir())
    assert writable_sink(Settings()) is None
    probe_path(out).mkdir()  # the probe's name is taken by a folder: its write fails
    for kind in ("file", "parquet", "iceberg"):
        with pytest.raises(ConfigError, match=rf"^--sink {kind}:{out}: cannot write there \(Is a directory\)"):
            writable_sink(Settings(sink=f"{kind}:{out}", stream="s"))
    with pytest.raises(ConfigError, match=r"^--sink file:/proc/out: cannot create it \(.+\): "):
        writable_sink(Settings(sink="file:/proc/out"))
    # a table whose catalog is elsewhere keeps its files where the catalog says
    assert writable_sink(Settings(sink=f"iceberg:{out}", stream="s", table_catalog={"type": "rest"})) is None


def test_a_free_unix_path_is_fine_and_a_missing_folder_is_named(tmp_path):
    free_unix_path(tmp_path / "mld.sock")
    with pytest.raises(ConfigError) as caught:
        free_unix_path(tmp_path / "missing" / "mld.sock")
    assert str(caught.value) == (f"--unix {tmp_path / 'missing' / 'mld.sock'}: the folder {tmp_path / 'missing'} "
                                 "does not exist: create it or choose another path")


def test_a_stale_socket_is_removed(tmp_path):
    path = tmp_path / "mld.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))  # bound, never listening: what a crashed server leaves
    sock.close()
    free_unix_path(path)
    assert not path.exists()


def test_a_live_socket_is_refused_and_kept(tmp_path):
    path = tmp_path / "mld.sock"
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(path))
        live.listen()
        with pytest.raises(ConfigError, match="another server listens there: stop it or choose another path"):
            free_unix_path(path)
        assert path.is_socket()


def test_a_file_that_is_not_a_socket_is_refused_and_kept(tmp_path):
    path = tmp_path / "mld.sock"
    path.write_text("precious\n")
    with pytest.raises(ConfigError, match="something that is not a socket is there"):
        free_unix_path(path)
    assert path.read_text() == "precious\n"
