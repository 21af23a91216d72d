"""The arenas (``pool/arena.py``): regions never overlap and come back whole; a batch's
line lands in its handler process's arena and is read there byte for byte, and its
rows come back in the process's rows arena, each region handed back once read;
handler processes SIGKILLed at random while the server writes lines into their arenas
and they write rows into theirs cost no record and no connection (each batch redone
whole elsewhere, or dead-lettered with its data), and a dead process's arenas are let go."""

from __future__ import annotations

import asyncio
import base64
import gc
from array import array
import hashlib
import logging
import os
import random
import signal

import pytest

from mldserver.pool.arena import ARENA_MIN, Arena, ArenaView, extent

from ..harness import eventually, running
from .serving import T0, dead_letters, pooled

SIZE = 1024


@pytest.fixture
def arena():
    """An arena of 1 KiB, closed after the test."""
    arena = Arena.create(1024)
    yield arena
    arena.close()


def test_a_region_takes_several_parts_one_after_another(arena):
    region = arena.put(array("I", [1, 2]), b"xyz", memoryview(b"--tail--")[2:6])
    assert region == (0, 15) and arena.used == 64
    assert bytes(arena.map[0:15]) == array("I", [1, 2]).tobytes() + b"xyz" + b"tail"


def test_a_view_reads_only_inside_its_arena_and_closes_with_a_region_alive(arena):
    region = arena.put(b"rows\n" * 10)
    view = ArenaView(os.dup(arena.fd), arena.size)
    assert bytes(view.region(*region)) == b"rows\n" * 10
    for bad in ((1000, 100), (-1, 10), (0, -1)):
        with pytest.raises(ValueError, match="not inside the arena of 1024 bytes"):
            view.region(*bad)
    alive = view.region(0, 5)
    view.close()  # a region still read: no BufferError, unmapped once it goes
    assert bytes(alive) == b"rows\n"


def test_regions_are_first_fit_and_come_back_whole(arena):
    a = arena.put(b"a" * 100)
    b = arena.put(b"b" * 64)
    c = arena.put(b"c" * 500)
    assert (a, b, c) == ((0, 100), (128, 64), (192, 500))  # 64-byte aligned
    assert arena.put(b"x" * 400) is None and arena.misses == 1  # 320 bytes left at the end
    arena.free(b)
    assert arena.put(b"d" * 60) == (128, 60)  # the hole, first
    assert bytes(arena.map[0:100]) == b"a" * 100 and bytes(arena.map[192:692]) == b"c" * 500
    for region in (a, (128, 60), c):
        arena.free(region)
    assert arena.used == 0 and arena._free == [(0, 1024)]  # coalesced into one again
    assert arena.put(b"y" * 2048) is None  # larger than the arena: the pipe takes it


@pytest.mark.parametrize("seed", range(5))
def test_random_puts_and_frees_never_overlap_and_keep_their_bytes(seed):
    rng = random.Random(seed)
    arena = Arena.create(1 << 16)
    live: dict[tuple[int, int], bytes] = {}
    try:
        for step in range(2_000):
            if live and (rng.random() < 0.45 or arena.used > 60_000):
                region = rng.choice(list(live))
                assert bytes(arena.map[region[0]:region[0] + region[1]]) == live.pop(region)
                arena.free(region)
            else:
                data = rng.randbytes(rng.randint(1, 4_000))
                region = arena.put(data)
                if region is not None:
                    live[region] = data
            spans = sorted((o, o + -(-n // 64) * 64) for o, n in live)
            assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), step
            assert arena.used == sum(end - start for start, end in spans)
        for region in list(live):
            arena.free(region)
        assert arena._free == [(0, 1 << 16)]
    finally:
        arena.close()


def test_a_region_given_back_in_parts_cut_anywhere_comes_back_whole(arena):
    """The server holds a batch's rows until their windows commit, a part a window, cut
    at any byte: the parts come back one by one, in any order, exactly."""
    a = arena.put(b"a" * 300)
    b = arena.put(b"b" * 10)
    assert extent(a) == (0, 320) and extent(b) == (320, 64) and arena.used == 384
    arena.release(30, 150)  # a middle part first
    assert arena._free == [(30, 150), (384, 640)] and arena.used == 234
    assert arena.put(b"c" * 60) == (64, 60)  # in that hole, aligned: 30-64 and 128-180 stay free
    assert arena._free == [(30, 34), (128, 52), (384, 640)]
    arena.release(0, 30)
    arena.release(180, 140)
    arena.free((64, 60))
    assert arena._free == [(0, 320), (384, 640)] and arena.used == 64
    arena.free(b)
    assert arena._free == [(0, 1024)] and arena.used == 0


@pytest.mark.parametrize("seed", range(5))
def test_random_regions_given_back_in_random_parts_never_overlap(seed):
    rng = random.Random(seed)
    arena = Arena.create(1 << 16)
    live: dict[tuple[int, int], bytes] = {}  # parts still held: (offset, size) -> their bytes
    try:
        for step in range(2_000):
            if live and (rng.random() < 0.45 or arena.used > 60_000):
                offset, size = part = rng.choice(list(live))
                assert bytes(arena.map[offset : offset + size]) == live.pop(part)
                arena.release(offset, size)
            else:
                data = rng.randbytes(rng.randint(1, 4_000))
                region = arena.put(data)
                if region is not None:
                    assert region[0] % 64 == 0
                    offset, size = extent(region)
                    held = bytes(arena.map[offset : offset + size])
                    assert held[: len(data)] == data
                    cuts = sorted(rng.sample(range(1, size), min(size - 1, rng.randint(0, 3))))
                    for start, end in zip([0, *cuts], [*cuts, size]):
                        live[(offset + start, end - start)] = held[start:end]
            spans = sorted((o, o + n) for o, n in live)
            assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), step
            assert arena.used == sum(end - start for start, end in spans)
        for offset, size in list(live):
            arena.release(offset, size)
        assert arena._free == [(0, 1 << 16)]
    finally:
        arena.close()


def resident_rows_kib() -> int:
    """KiB of the handler processes' rows arenas in this process's memory (its maps of them)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        lines = smaps.readlines()
    for line in lines:
        if "-" in line.split(" ", 1)[0]:  # a mapping's first line: "start-end perms ... path"
            inside = "mldserver-rows" in line
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def allocated(arena: Arena) -> int:
    """Bytes of the arena's shared memory that have pages (a memfd's blocks)."""
    return os.fstat(arena.fd).st_blocks * 512


def test_pages_no_region_has_used_for_a_trim_period_go_back_to_the_system():
    arena = Arena.create(4 << 20)
    try:
        low = arena.put(b"l" * 100_000)
        high = arena.put(b"h" * 2_000_000)  # a burst
        assert allocated(arena) >= 2_000_000
        arena.free(high)
        assert arena.trim() == 0  # used within the period: kept, for the next batch
        assert arena.trim() > 1_900_000 and allocated(arena) < 200_000  # unused for a whole period: given back
        assert bytes(arena.map[0:100_000]) == b"l" * 100_000  # what is held stays
        again = arena.put(b"a" * 1_000_000)  # the pages come back as they are written
        assert bytes(arena.map[again[0] : again[0] + 1_000_000]) == b"a" * 1_000_000
        arena.free(again)
        arena.free(low)
        arena.trim()
        arena.trim()
        assert allocated(arena) == 0 and arena.trim() == 0
    finally:
        arena.close()


def test_a_hole_below_regions_still_held_goes_back_once_unused_for_a_trim_period():
    """A window's rows lie between later windows' rows (shards interleave): its commit
    leaves a hole below rows still held, and the hole's pages go back too."""
    arena = Arena.create(8 << 20)
    try:
        first = arena.put(b"f" * 3_000_000)
        held = arena.put(b"h" * 1_000_000)
        arena.free(first)
        assert arena.trim() == 0  # used within the period: kept, for the next batch
        assert arena.trim() >= 2_990_000  # unused for a whole period, under a region held: given back
        assert allocated(arena) < 1_100_000
        assert bytes(arena.map[held[0] : held[0] + held[1]]) == b"h" * 1_000_000
        assert arena.trim() == 0  # given back once
        again = arena.put(b"a" * 500_000)  # first fit: into the hole, its pages faulted in again
        assert again[0] == 0 and bytes(arena.map[0:500_000]) == b"a" * 500_000
    finally:
        arena.close()


@pytest.mark.parametrize("seed", range(5))
def test_random_puts_frees_and_trims_keep_every_held_byte_and_give_back_what_is_free(seed):
    """A seeded campaign of puts, frees (whole or in parts) and trims: no trim touches a
    byte of a region held, and two trims with nothing put between leave no page in
    memory but those regions held use."""
    rng = random.Random(seed)
    arena = Arena.create(4 << 20)
    page = 4096
    live: dict[tuple[int, int], bytes] = {}
    try:
        for step in range(1_500):
            roll = rng.random()
            if roll < 0.05:
                arena.trim()
            elif live and (roll < 0.5 or arena.used > 3_500_000):
                region = rng.choice(list(live))
                data = live.pop(region)
                assert bytes(arena.map[region[0] : region[0] + region[1]]) == data, step
                offset, size = extent(region)
                cut = rng.randint(0, size)
                for part in ((offset, cut), (offset + cut, size - cut)):
                    if part[1]:
                        arena.release(*part)
            elif (region := arena.put(data := rng.randbytes(rng.randint(1, 200_000)))) is not None:
                live[region] = data
        arena.trim()
        arena.trim()
        pages = {p for o, n in live for p in range(o // page, -(-(o + n) // page))}
        assert allocated(arena) <= len(pages) * page
        assert all(bytes(arena.map[o : o + n]) == data for (o, n), data in live.items())
    finally:
        arena.close()


def payload(seq: int) -> bytes:
    return random.Random(seq).randbytes(SIZE)


def big_batch(first: int, records: int, at: int) -> list[dict]:
    """``records`` records of 1 KiB: a line of about 1.4 KiB a record, above ARENA_MIN."""
    return [{"action": "record", "data": base64.b64encode(payload(seq)).decode("ascii"),
             "partitionKey": f"pk{seq}", "sequenceNumber": str(seq), "subSequenceNumber": 0,
             "approximateArrivalTimestamp": at} for seq in range(first, first + records)]


async def drive(daemon, shards: int, batches: int, records: int) -> list:
    """Each shard's batches, shards concurrently, then a last small batch ten hours on
    that closes every window before it."""
    opened = await asyncio.gather(*(daemon.shard(f"shardId-{s:012d}") for s in range(shards)))

    async def one(shard):
        for n in range(batches):
            await shard.process_records(big_batch(1000 * (n + 1), records, T0 + n * 60_000), millis_behind_latest=1000)

    await asyncio.gather(*(one(shard) for shard in opened))
    await asyncio.gather(*(shard.process_records(big_batch(99_000, 1, T0 + 600 * 60_000), millis_behind_latest=1000)
                           for shard in opened))
    return opened


def wanted(shards: int, batches: int, records: int) -> dict[tuple[str, str], str]:
    return {(f"shardId-{s:012d}", str(seq)): hashlib.sha256(payload(seq)).hexdigest()
            for s in range(shards) for n in range(batches) for seq in range(1000 * (n + 1), 1000 * (n + 1) + records)}


def digests(sink) -> dict[tuple[str, str], str]:
    return {(r["shard"], r["seq"]): r["sha256"] for r in sink.rows}


async def every_row_committed(daemon, sink, shards: int, batches: int, records: int) -> list:
    """``drive``, then wait for every record's row in the sink, with its data's digest."""
    opened = await drive(daemon, shards, batches, records)
    want = wanted(shards, batches, records)
    await eventually(lambda: len(digests(sink).keys() & want.keys()) == len(want), timeout=30,
                     what="every record's row in the sink")
    assert {k: v for k, v in digests(sink).items() if k in want} == want
    return opened


async def test_a_record_kept_past_its_call_reads_its_own_line_not_what_reuses_its_region(tmp_path):
    """A handler process copies a batch's line at the call's end only when the handler
    kept a record of it (no copy otherwise): the kept record, read in the next call,
    after the next line landed in the region, reads its own fields."""
    shards, batches, records = 1, 4, 60
    async with running(tmp_path, **pooled("KeepsARecord", workers=1)) as (server, sink, daemon):
        opened = await drive(daemon, shards, batches, records)
        assert server.pool.serving()[0].channel.arena.puts == batches  # each large line through the arena
        lasts = [1000 * (n + 1) + records - 1 for n in range(batches - 1)]  # (the last's row: a window still open)
        want = {(str(seq), f"pk{seq}", hashlib.sha256(payload(seq)).hexdigest()) for seq in lasts}
        await eventually(lambda: len(sink.rows) == len(want), timeout=30, what="a row for each kept record")
        assert {(r["seq"], r["partition_key"], r["sha256"]) for r in sink.rows} == want
        for shard in opened:
            await shard.lease_lost()
            assert await shard.close() == 0


async def test_a_batch_line_crosses_in_the_arena_and_arrives_byte_for_byte(tmp_path):
    shards, batches, records = 4, 5, 60
    assert records * SIZE > ARENA_MIN
    async with running(tmp_path, **pooled("Digest", workers=2)) as (server, sink, daemon):
        opened = await every_row_committed(daemon, sink, shards, batches, records)
        processes = server.pool.serving()
        assert sum(p.channel.arena.puts for p in processes) == shards * batches  # every large line, none by the pipe
        assert all(p.channel.arena.used == 0 and not p.channel._regions for p in processes)  # each given back by its done
        await eventually(lambda: all(allocated(p.channel.arena) == 0 for p in processes), timeout=10,
                         what="the line arenas' pages given back to the system once unused (the pool's trim)")
        for shard in opened:
            await shard.lease_lost()
            assert await shard.close() == 0


async def test_a_batchs_rows_come_back_in_the_rows_arena_and_each_region_is_handed_back(tmp_path, monkeypatch):
    """32 batches' rows (about 90 KB each, 2.8 MB in all) through two rows arenas of 512
    KiB: the server reads each batch's rows where they lie and hands them back once their
    window has committed, so more rows cross the arenas than they hold at once; the rows
    arrive byte for byte, and in the end the server holds none of either arena."""
    monkeypatch.setattr("mldserver.pool.process.rows_arena_bytes", lambda cap, workers: 512 << 10)
    shards, batches, records = 4, 8, 60
    async with running(tmp_path, **pooled("DigestAndData", workers=2)) as (server, sink, daemon):
        opened = await every_row_committed(daemon, sink, shards, batches, records)
        datas = {(r["shard"], r["seq"]): r["data"] for r in sink.rows}
        assert all(base64.b64decode(datas[key]) == payload(int(key[1])) for key in wanted(shards, batches, records))
        processes = server.pool.serving()
        assert sum(p.channel.read for p in processes) > 2 * (512 << 10) // (records * 1_450)  # regions came back
        await eventually(lambda: all(p.channel.lent == 0 for p in processes), what="every region handed back")
        assert resident_rows_kib() > 0  # (the server reads them where they lie)
        await eventually(lambda: resident_rows_kib() == 0, timeout=10,
                         what="the rows arenas' pages given back to the system once unused (Arena.trim)")
        for shard in opened:
            await shard.lease_lost()
            assert await shard.close() == 0


async def test_rows_held_in_a_dead_processs_rows_arena_still_commit_byte_for_byte(tmp_path):
    """Both handler processes are SIGKILLed while the server holds the rows they put in
    their rows arenas (their window still open): the memory outlives them, the rows
    commit with their exact bytes once the window closes, nothing is dead-lettered or
    redone, and every connection stays open; the replacements' arenas are new."""
    shards, records = 4, 60
    async with running(tmp_path, **pooled("DigestAndData", workers=2)) as (server, sink, daemon):
        opened = await asyncio.gather(*(daemon.shard(f"shardId-{s:012d}") for s in range(shards)))
        for n in range(2):  # two batches a shard, one window: held, not committed
            await asyncio.gather(*(shard.process_records(big_batch(1000 * (n + 1), records, T0 + n * 1_000),
                                                         millis_behind_latest=1000) for shard in opened))
        first = server.pool.serving()
        assert sum(p.channel.read for p in first) == shards * 2 and all(p.channel.lent > 0 for p in first)
        assert not sink.rows
        for p in first:
            os.kill(p.pid, signal.SIGKILL)
        await eventually(lambda: all(p.life.died.is_set() for p in first), timeout=20, what="both processes reaped")
        assert all(p.channel.rows is None for p in first)  # let go by the server; mapped on by the rows it holds
        await asyncio.gather(*(shard.process_records(big_batch(99_000, 1, T0 + 600 * 60_000), millis_behind_latest=1000)
                               for shard in opened))  # closes the window: it commits
        want = {(f"shardId-{s:012d}", str(seq)): hashlib.sha256(payload(seq)).hexdigest()
                for s in range(shards) for n in range(2) for seq in range(1000 * (n + 1), 1000 * (n + 1) + records)}
        await eventually(lambda: want.keys() <= digests(sink).keys(), timeout=30, what="the held rows committed")
        assert {k: v for k, v in digests(sink).items() if k in want} == want
        datas = {(r["shard"], r["seq"]): r["data"] for r in sink.rows}
        assert all(base64.b64decode(datas[key]) == payload(int(key[1])) for key in want)
        assert len(sink.rows) == len({(r["shard"], r["seq"]) for r in sink.rows})  # none twice
        assert not any(dead_letters(tmp_path, s.shard_id) for s in opened)
        await eventually(lambda: all(p.channel.lent == 0 for p in first), what="the dead processes' rows let go")
        for shard in opened:
            await shard.lease_lost()
            assert await shard.close() == 0


async def test_a_process_killed_right_after_its_done_frame_names_its_rows_loses_and_repeats_none(tmp_path):
    """The process that handled batch 5000's records dies the moment its call has
    returned: its done frame and the rows it names in the rows arena are read after (or
    the batch is redone if the frame never left). Every row arrives exactly once, nothing
    is dead-lettered, every connection stays open."""
    shards, batches, records = 2, 6, 60
    async with running(tmp_path, **pooled("DigestAndDataThenDie", workers=2)) as (server, sink, daemon):
        first = server.pool.serving()
        opened = await every_row_committed(daemon, sink, shards, batches, records)
        keys = [(r["shard"], r["seq"]) for r in sink.rows]
        assert len(keys) == len(set(keys))  # none twice
        assert not any(dead_letters(tmp_path, s.shard_id) for s in opened)
        await eventually(lambda: any(p.life.died.is_set() for p in first), timeout=20, what="the process that died reaped")
        for shard in opened:
            await shard.lease_lost()
            assert await shard.close() == 0


async def test_the_rows_of_a_batch_redone_after_its_process_died_are_let_go_without_the_cyclic_gc(
        tmp_path, monkeypatch):
    """A batch whose process dies in its call is redone elsewhere; the redo's rows, in
    the new process's rows arena, are handed back once their window commits, by
    reference counting alone: nothing the failed attempt left (its exception, its
    traceback's frames) holds them in a reference cycle until a collection that may be
    minutes away. The cyclic GC is off for the test."""
    marker = tmp_path / "died"
    monkeypatch.setenv("MLDSERVER_TEST_MARKER", str(marker))
    shards, batches, records = 2, 4, 60
    gc.collect()
    gc.disable()
    try:
        async with running(tmp_path, **pooled("DigestAndDataDiesOnce", workers=2)) as (server, sink, daemon):
            processes = set(server.pool.serving())  # and every one started later (a redo's own)
            make = server.pool._process
            server.pool._process = lambda *args: processes.add(proc := make(*args)) or proc
            opened = await every_row_committed(daemon, sink, shards, batches, records)
            assert marker.exists(), "no process died"
            assert sum(p.channel.read for p in processes) >= shards * batches
            await eventually(lambda: all(p.channel.lent == 0 for p in processes),
                             what="every rows arena's bytes handed back once committed, with no collection")
            for shard in opened:
                await shard.lease_lost()
                assert await shard.close() == 0
    finally:
        gc.enable()


@pytest.mark.parametrize("seed", [11, 23, 47])
@pytest.mark.parametrize("handler", ["Digest", "DigestAndData"])  # rows by the pipe; in the rows arena
async def test_handler_processes_killed_at_random_while_lines_land_in_their_arenas_lose_nothing(
        seed, handler, tmp_path, caplog):
    """SIGKILLs from outside, at seeded random moments, of whichever handler process the
    seed picks, while 4 shards send 1 KiB batches through the arenas: every record's row
    reaches the sink with its exact bytes, or its batch is dead-lettered with its data;
    every connection stays open (the strict fake daemon sees one status per action); the
    dead processes' arenas are closed and the live ones hold no region."""
    caplog.set_level(logging.INFO, logger="mldserver")
    shards, batches, records = 4, 12, 60
    rng = random.Random(seed)
    async with running(tmp_path, **pooled(handler, workers=2)) as (server, sink, daemon):
        killed = []

        async def killer():
            for _ in range(5):
                await asyncio.sleep(rng.uniform(0.05, 0.4))
                live = [p for p in server.pool.serving() if p.alive and p.pid]
                if live:
                    victim = rng.choice(live)
                    killed.append(victim)
                    os.kill(victim.pid, signal.SIGKILL)

        kills = asyncio.ensure_future(killer())
        try:
            opened = await drive(daemon, shards, batches, records)
        finally:
            await kills
        want = wanted(shards, batches, records)
        lettered = {(s.shard_id, letter["sequence_number"]): hashlib.sha256(base64.b64decode(letter["data"])).hexdigest()
                    for s in opened for letter in dead_letters(tmp_path, s.shard_id)}
        await eventually(lambda: len((digests(sink).keys() | lettered.keys()) & want.keys()) == len(want), timeout=60,
                         what="every record's row in the sink, or its batch dead-lettered")
        got = {k: v for k, v in {**digests(sink), **lettered}.items() if k in want}
        assert got == want  # the exact bytes, whichever way each record went
        assert killed, "the campaign killed nothing"
        await eventually(lambda: all(p.life.died.is_set() for p in killed), timeout=20, what="the killed processes reaped")
        assert all(p.channel.arena is None and p.channel.rows is None for p in killed)  # let go with its process
        if handler == "DigestAndData":
            assert sum(p.channel.read for p in {*killed, *server.pool.serving()}) > 0, "no rows in a rows arena"
        for p in server.pool.serving():
            assert p.channel.arena is not None and p.channel.arena.used == 0 and not p.channel._regions
        await eventually(lambda: all(p.channel.lent == 0 for p in {*killed, *server.pool.serving()}),
                         what="every row in a rows arena, a dead process's too, let go once committed")
        for shard in opened:
            await shard.lease_lost()
            assert await shard.close() == 0
