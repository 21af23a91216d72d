"""A window's input file: the parquet file the server writes and the Spark process
reads (``spark.read.parquet``), once, then deletes. Both sinks write it here::

    write_input(table, Path("state/spark/windows/<id>.parquet"), parallelism=2)

- Plain: no compression and no dictionaries to build (some 20 ms less for a
  100,000-row window; Spark reads it no slower).
- Cut into row groups, one for each task Spark runs at once (``parallelism``, the
  Spark process's ``defaultParallelism``, told when it starts), so its scan and
  whatever the pipeline does before a shuffle use every core: Spark splits a file at
  row groups, never inside one. No group is smaller than ``SPLIT_BYTES``, the size
  Spark itself packs into one task (``spark.sql.files.openCostInBytes``), so a small
  window stays one group, one task, one output file::

      row_groups(rows=100_000, nbytes=23_000_000, parallelism=2)   # 2: 50,000 rows each
      row_groups(rows=15_000, nbytes=3_500_000, parallelism=2)     # 1

On this machine (2 cores) Spark's job for a 100,000-row identity window takes some
100 ms less cut in two (``mldserver bench --part spark``). An identity pipeline then
writes one file a group (``part-00000``, ``part-00001``, in the rows' order).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SPLIT_BYTES = 4 << 20  # Spark's default spark.sql.files.openCostInBytes


def row_groups(rows: int, nbytes: int, parallelism: int) -> int:
    """How many row groups a window's file is cut into (at least 1)::

    >>> row_groups(100_000, 23_000_000, 2), row_groups(15_000, 3_500_000, 2), row_groups(0, 0, 8)
    (2, 1, 1)
    >>> row_groups(100_000, 23_000_000, 16)   # 5 groups of 4.6 MB, not 16 of 1.4
    5
    """
    return max(1, min(parallelism, nbytes // SPLIT_BYTES, rows))


def write_input(table: pa.Table, path: Path, parallelism: int = 1) -> None:
    """Write ``table`` to ``path`` whole or not at all (a temporary name, renamed)."""
    groups = row_groups(table.num_rows, table.nbytes, parallelism)
    tmp = path.with_name(f"_{path.name}")
    pq.write_table(table, tmp, compression="none", use_dictionary=False,
                   row_group_size=max(1, -(-table.num_rows // groups)))
    tmp.replace(path)
