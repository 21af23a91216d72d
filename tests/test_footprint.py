"""What a process imports it holds for its life, in every handler process and the
server: a handler process and a serving server load only what they run (a module tree
is some 0.1 to 2 MiB a process)."""

from __future__ import annotations

from .test_rows import loaded_after


def test_a_handler_process_loads_nothing_only_the_server_or_the_command_line_runs():
    script = ("import mldserver.pool.child\n"
              "from mldserver.pool.malloc import one_heap, reuse_large_buffers\n"
              "assert reuse_large_buffers() and one_heap()  # glibc's, found through the process's own symbols\n")
    # (tomllib too, but the tests read the log events' catalogue with it: MLDSERVER_CHECK_EVENTS)
    only_elsewhere = ("difflib", "logging.handlers", "shutil", "secrets", "ctypes.util",
                      "mldserver.sources", "mldserver.coordinator", "numpy")
    assert loaded_after(script, *only_elsewhere) == []


def test_a_server_with_its_admin_endpoint_loads_the_sources_only_to_read_a_stream_and_the_coordinator_for_a_sink():
    script = "import mldserver.server.server, mldserver.server.admin\n"
    assert loaded_after(script, "mldserver.sources", "mldserver.coordinator") == []


def test_the_handler_the_relay_bench_measures_loads_what_a_users_handler_module_would():
    # Its handler processes' memory counts as the server's against amazon_kclpy's children:
    # the bench's own machinery (the fake daemon, the emulators, temporary folders) in them
    # would be charged to the server (some 1.8 MiB a handler process).
    script = "import mldserver.pool.child, mldserver.ops.bench.touch\n"
    assert loaded_after(script, "mldserver.ops.bench.common", "mldserver.api.testing", "mldserver.ops.emulators",
                        "tempfile", "shutil", "http.client", "email") == []
