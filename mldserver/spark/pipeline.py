"""The pipeline API: ``--pipeline MODULE:ATTR`` names a callable run in the Spark
process once per closed window::

    from pyspark.sql import functions as F

    def orders_per_customer(df, window):       # df: the window's rows, with their schema
        return (df.groupBy("customer")          # return a DataFrame to write,
                  .agg(F.count("*").alias("orders"), F.sum("amount").alias("amount"))
                  .withColumn("window_start", F.lit(window.start)))
                                                # or None if it wrote its own output

``window`` is a :class:`WindowInfo`. SQL is Spark's own, named parameters included:
``df.sparkSession.sql("SELECT ... WHERE x > :low", args={"low": 3})``.
With a sink but no pipeline, :func:`identity` writes the rows as they are.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WindowInfo:
    """The window a pipeline is given with its rows (``pipeline(df, window)``)::

        def per_customer(df, window):
            out = df.groupBy("customer").count()
            return out.withColumn("window_start", F.lit(window.start))   # epoch ms
        # window.id == "1763719200000-1763719260000"; window.late_rows: rows that came late

    ``id`` names the output's partition (``window=<id>``); ``start`` (inclusive) and
    ``end`` (exclusive) are epoch ms; ``version`` counts amendments (``allowed_lateness``)."""

    id: str  # "<start>-<end>", the output partition is window=<id>
    start: int  # epoch ms, inclusive
    end: int  # epoch ms, exclusive
    rows: int  # rows handed over, late rows included
    late_rows: int  # rows older than a window already committed, handed over with this one
    # or "hopping": windows --slide apart, each row in window/slide of them; or "session": the
    # sessions that closed together, each row with its session's window_start and window_end
    kind: str = "tumbling"
    version: int = 0  # with allowed_lateness: 1, then 2, ... once amended (its output replaces the last)

    @property
    def late(self) -> bool:
        """Whether late rows (of windows already committed) came with this one."""
        return self.late_rows > 0


def identity(df, window: WindowInfo):
    return df
