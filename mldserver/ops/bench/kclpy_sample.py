"""The processor ``mldserver bench --part kclpy`` measures on both sides: amazon_kclpy's
own sample (``samples/sample_kclpy_app.py``, as kclpy-ext installs it) with its log
turned off through its own ``log`` method, so that both sides do the sample's work per
record (decode, parse the sequence number, format the log line, track the largest)
without writing it::

    mldserver serve --handler mldserver.ops.bench.kclpy_sample:QuietSample
"""

from __future__ import annotations

from samples.sample_kclpy_app import RecordProcessor


class QuietSample(RecordProcessor):
    def log(self, message):
        pass
