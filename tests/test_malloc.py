"""Large buffers go back to the system when freed: the memory of a burst of batches
in flight is not kept for ever (``mldserver/base/malloc.py``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

BURST = r"""
import sys
from mldserver.base.malloc import large_buffers_from_mmap

def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

if sys.argv[1] == "on":
    assert large_buffers_from_mmap()
first = b"x" * (8 << 20)
del first                                 # glibc raises its mmap threshold to 8 MiB here
before = rss_mib()
lines, kept = [], []
for _ in range(40):                       # 40 lines of 3 MiB in flight, and beside each
    lines.append(b"y" * (3 << 20))       # a small object that outlives it (malloc'ed:
    kept.append(bytes(1000))              # over pymalloc's 512 bytes)
del lines
print(rss_mib() - before)                 # what the burst left behind
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_burst_of_large_buffers_is_returned_to_the_system_once_freed():
    def kept(mode: str) -> float:
        out = subprocess.run([sys.executable, "-c", BURST, mode], capture_output=True, text=True, check=True)
        return float(out.stdout)

    assert kept("off") > 60  # the allocator's default keeps (most of) the 120 MiB
    assert kept("on") < 10
