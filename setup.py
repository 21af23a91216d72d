"""Builds the native parts, so a wheel or an editable install carries them:

- the relay the daemon starts once per shard (``mldserver/ops/relay.c`` ->
  ``mldserver/ops/mldserver-relay``, an executable, not a Python module);
- the scan of a processRecords line for its records' sequence numbers, in the server
  (``mldserver/protocol/_scan.c`` -> ``mldserver.protocol._scan``, an extension module);
- the decoding of its records' base64 data, in a handler process
  (``mldserver/pool/_b64.c`` -> ``mldserver.pool._b64``); the two read the line with one
  JSON cursor (``mldserver/protocol/_cursor.h``, included by both);
- the collector of the rows a handler emits (``mldserver/rows/_emitted.c`` ->
  ``mldserver.rows._emitted``: ``batch.emit`` itself);
- the gather of a window's rows into merged order (``mldserver/coordinator/_gather.c``
  -> ``mldserver.coordinator._gather``).

Everything else about the package is in pyproject.toml. Without a C compiler the
install still succeeds, with a warning: ``mldserver connect`` then runs the relay in
Python (``relay.py``), the same program at about 3.5 MiB more memory per shard, and the
server reads sequence numbers with pysimdjson (``protocol/lazy.py``), the same
positions at some 0.3 us more a record with a sink, a handler's ``record.data`` is
decoded a record at a time (``Record.data``, pybase64), and ``batch.emit`` is Python's
(``api/emitted.py``), some 0.2 us more a row, and rows of shards that interleave are
gathered by pyarrow (``coordinator/merge.py``), some 0.1 us more a row.
"""

from __future__ import annotations

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

RELAY = "mldserver.ops.mldserver-relay"
CURSOR = "mldserver/protocol/_cursor.h"  # (a depends: rebuilt when it changes, and in the sdist)
CHECK = "mldserver/protocol/_check.h"


class BuildRelay(build_ext):
    """build_ext that links the relay as an executable, named without a module suffix."""

    def get_ext_filename(self, fullname: str) -> str:
        if fullname in (RELAY, RELAY.rpartition(".")[2]):  # (distutils asks for the last part alone)
            return os.path.join(*fullname.split("."))
        return super().get_ext_filename(fullname)

    def build_extension(self, ext: Extension) -> None:
        if ext.name != RELAY:  # (optional: a failed build is a warning, and pysimdjson serves)
            return super().build_extension(ext)
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            objects = self.compiler.compile(ext.sources, output_dir=self.build_temp,
                                            extra_postargs=["-O2", "-pthread"])
            self.compiler.link_executable(objects, os.path.basename(target), output_dir=os.path.dirname(target),
                                          extra_postargs=["-pthread"])
        except Exception as exc:  # no compiler, no libc headers: the Python relay serves
            self.warn(f"the native relay was not built ({exc}); `mldserver connect` will run relay.py")


setup(
    ext_modules=[
        Extension(RELAY, sources=["mldserver/ops/relay.c"], optional=True),
        Extension("mldserver.protocol._scan", sources=["mldserver/protocol/_scan.c"], depends=[CURSOR, CHECK],
                  optional=True, extra_compile_args=["-O2"]),
        Extension("mldserver.pool._b64", sources=["mldserver/pool/_b64.c"], depends=[CURSOR], optional=True,
                  extra_compile_args=["-O2"]),
        Extension("mldserver.rows._emitted", sources=["mldserver/rows/_emitted.c"], optional=True,
                  extra_compile_args=["-O2"]),
        Extension("mldserver.coordinator._gather", sources=["mldserver/coordinator/_gather.c"], optional=True,
                  extra_compile_args=["-O2"]),
    ],
    cmdclass={"build_ext": BuildRelay},
)
