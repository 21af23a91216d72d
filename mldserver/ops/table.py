"""``mldserver table maintain``: the Iceberg table sink's maintenance, by hand.

What a server with the table sink runs every ``table_maintenance_interval``
(``sinks/maintenance.py``): snapshots past ``table_snapshots_kept`` expired, files no
snapshot names (commits that lost a conflict, a server killed between writing and
committing) removed once older than ``table_orphan_age``. Safe beside running servers;
run it from any machine with the servers' config::

    $ mldserver table maintain --config /etc/mldserver.toml
    table mldserver.windows: expired 16 snapshots; 1,204 files, 16 orphans removed (2.0 MiB), 1 newer than 3600 s kept

    $ mldserver table maintain --config /etc/mldserver.toml --dry-run
    table mldserver.windows: 1,204 files, 16 orphans would be removed (2.0 MiB), 1 newer than 3600 s kept
      s3://lake/warehouse/mldserver/windows/data/00000-0-5d1c....parquet
      ...

Exit 0 when it ran (or there is no table yet), 1 when maintenance failed (nothing is
lost: it only removes what nothing names), 2 with one line when the settings name no
table sink or the catalog or the warehouse cannot be reached.
"""

from __future__ import annotations

from typing import TextIO

from ..base.config import Settings, SinkSpec
from ..errors import ConfigError


def main(settings: Settings, dry_run: bool, out: TextIO) -> int:
    if not settings.sink or SinkSpec.parse(settings.sink).kind != "iceberg":
        raise ConfigError("mldserver table maintain: no table sink: give --sink iceberg:DIR (or --config with "
                          "sink = \"iceberg:...\")")
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    from ..sinks.iceberg import open_catalog, probe, said
    from ..sinks.maintenance import maintain

    directory = SinkSpec.parse(settings.sink).directory
    probe(settings, directory)  # the catalog and the warehouse reached: one line (exit 2) if not
    namespace, _, name = settings.table.rpartition(".")
    try:
        table = open_catalog(settings, directory).load_table((namespace, name))
    except (NoSuchTableError, NoSuchNamespaceError):
        out.write(f"table {settings.table}: no such table yet (a server makes it at its first window)\n")
        return 0
    try:
        report = maintain(table, keep=settings.table_snapshots_kept, older_than=settings.table_orphan_age,
                          dry_run=dry_run)
    except Exception as exc:  # a conflict ten times over, a file that cannot be deleted
        out.write(f"table {settings.table}: maintenance failed: {said(exc)}\n")
        return 1
    size = f"{report.orphan_bytes / (1 << 20):.1f} MiB"
    verb = "would be removed" if dry_run else "removed"
    expired = "" if dry_run else f"expired {report.expired} snapshots; "
    out.write(f"table {settings.table}: {expired}{report.files:,} files, {report.orphans} orphans {verb} ({size}), "
              f"{report.young} newer than {settings.table_orphan_age:g} s kept\n")
    if dry_run:
        for location in report.deleted:
            out.write(f"  {location}\n")
    return 0
