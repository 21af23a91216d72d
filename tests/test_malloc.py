"""Large buffers are reused while batches flow (not faulted in again for each batch), and
the memory of a burst of batches in flight is given back once they are freed; threads
that take turns share one heap (``mldserver/pool/malloc.py``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")

PRELUDE = r"""
import sys, time
from mldserver.pool.malloc import reuse_large_buffers

def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

def faults():
    return int(open("/proc/self/stat").read().rpartition(")")[2].split()[7])  # minflt

if sys.argv[1] == "default":
    assert reuse_large_buffers()
elif sys.argv[1] == "mmap":               # every large buffer mapped anew (glibc's fixed threshold)
    import ctypes, ctypes.util
    assert ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt(-3, 128 << 10)
elif sys.argv[1] != "off":                # else glibc's default
    assert reuse_large_buffers(period=float(sys.argv[1]))
"""

# 200 batches through, one at a time: a line of 3 MiB and its frame of 3 MiB
CHURN = PRELUDE + r"""
before = faults()
for i in range(200):
    line = bytes([i % 256]) * (3 << 20)
    frame = line + b"\n"
    del line, frame
print(faults() - before)
"""

# 24 batches through, four in flight: each line freed 0.1 s before the next arrives, as
# in a server of many shards (a shard's next line comes once its last is answered)
RING = PRELUDE + r"""
lines = [bytes(3 << 20) for _ in range(4)]
before = faults()
for i in range(24):
    lines.pop(0)
    time.sleep(0.1)
    lines.append(bytes([i % 256]) * (3 << 20))
print(faults() - before)
"""

# 40 lines of 3 MiB in flight at once, each beside a small object that outlives it
BURST = PRELUDE + r"""
before = rss_mib()
lines, kept = [], []
for _ in range(40):
    lines.append(b"y" * (3 << 20))
    kept.append(bytes(1000))              # (malloc'ed: over pymalloc's 512 bytes)
del lines
deadline = time.monotonic() + float(sys.argv[2])  # waiting for the trim, if any
while rss_mib() - before > 10 and time.monotonic() < deadline:
    time.sleep(0.05)
print(rss_mib() - before)                 # what the burst left behind
"""


# 16 shards' threads, alive together, taking turns: each decodes a batch (2,000 records
# of 1,400 bytes, malloc'ed) and frees it, with no trim in between
TURNS = PRELUDE + r"""
import threading
from mldserver.pool.malloc import one_heap

if sys.argv[2] == "one heap":
    assert one_heap()
turns = [threading.Event() for _ in range(17)]

def shard(i):
    turns[i].wait()
    batch = [bytes([i]) * 1400 for _ in range(2000)]
    del batch
    turns[i + 1].set()

threads = [threading.Thread(target=shard, args=(i,)) for i in range(16)]
for t in threads:
    t.start()
before = rss_mib()
turns[0].set()
turns[16].wait()
print(rss_mib() - before)                 # what the 16 batches left behind
for t in threads:
    t.join()
"""


def run(script: str, period: str, wait: float | str = 0) -> float:
    out = subprocess.run([sys.executable, "-c", script, period, str(wait)], capture_output=True, text=True,
                         check=True)
    return float(out.stdout)


def test_a_batch_s_buffers_reuse_the_pages_the_last_batch_freed():
    # mapped anew, each buffer is faulted in again: ~1,500 faults a batch (glibc's default
    # does so until its threshold slides; how often after that depends on what else the
    # heap holds, so the fixed threshold is the baseline)
    assert run(CHURN, "mmap") > 200_000
    # (no trim while the 200 go through: each trim hands back a batch's free pages, so with
    # a short period the count grew with how long the loop took, i.e. with the machine's load)
    assert run(CHURN, "3600") < 5_000


def test_lines_that_live_a_while_reuse_the_pages_of_the_lines_before_them():
    # a trim every 0.1 s gives back each line freed and the next takes its pages again
    assert run(RING, "0.1") > 8_000
    assert run(RING, "default") < 4_000  # (a trim every 10 s: the lines' pages stay in use)


def test_a_burst_of_large_buffers_is_returned_to_the_system_once_freed():
    assert run(BURST, "3600") > 60  # kept until a trim: most of the 120 MiB
    assert run(BURST, "0.1", wait=10) < 10


def test_threads_that_take_turns_reuse_one_heap_instead_of_keeping_a_batch_each():
    assert run(TURNS, "3600", "a heap each") > 20  # 16 heaps, each keeping its batch's 2.8 MB
    assert run(TURNS, "3600", "one heap") < 8
