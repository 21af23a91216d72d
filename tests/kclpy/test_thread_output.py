"""What an amazon_kclpy processor's own threads print, in a handler process: each line a
``handler_output`` event in the server's log, with the thread's name and the shard
whose processor started it; nothing of it on the server's stderr beside the log."""

from __future__ import annotations

from mldserver.api.testing import FakeDaemon, make_records

from ..harness import eventually, relay_command


async def test_a_processors_own_threads_print_into_the_log_with_their_shard(serve):
    server = serve("tests.kclpy_handlers:ThreadPrints", "--workers", "1")
    daemon = FakeDaemon(relay_command(server.port))
    a, b = await daemon.shard("shardId-000000000001"), await daemon.shard("shardId-000000000002")
    await a.process_records(make_records(1, 3))
    await b.process_records(make_records(10, 2))

    def printed():
        return sorted((e.get("shard_id"), e.get("thread"), e["stream"], e["line"]) for e in server.events()
                      if e["event"] == "handler_output")

    expected = sorted([
        (a.shard_id, "uploader", "stdout", "uploaded 3 records made"), (a.shard_id, "uploader", "stderr", "partial line"),
        (a.shard_id, "flusher", "stdout", "flushed 3"),
        (b.shard_id, "uploader", "stdout", "uploaded 2 records made"), (b.shard_id, "uploader", "stderr", "partial line"),
        (b.shard_id, "flusher", "stdout", "flushed 2"),
    ])
    await eventually(lambda: printed() == expected, what=f"the threads' lines logged: {printed()}")
    for shard in (a, b):
        await shard.lease_lost()
        assert await shard.close() == 0
    assert "uploaded" not in server.stderr and "flushed" not in server.stderr and "partial" not in server.stderr
