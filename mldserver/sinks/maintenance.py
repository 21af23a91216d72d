"""Table maintenance for the Iceberg sink: old snapshots expired, orphan files removed.

Commits already expire all but the last ``table_snapshots_kept`` snapshots once there
are twice as many. What they leave behind are **orphan files**: files under the table's
location that no snapshot, manifest list, manifest or metadata file names. Servers
sharing a table leave them whenever a commit loses a conflict (its data files are
written, the retry writes its own), a server dies between writing its files and
committing them, or manifest merging replaces a snapshot's manifests. They cost storage
only (readers never see them), but they grow for ever: about one file in five after an
afternoon of three servers on S3.

``maintain(table, keep=16, older_than=3600)`` expires snapshots past ``keep`` (one
compare-and-swap commit, like any other: a conflict with a server's commit is retried
on the new metadata), then lists every file under the table's location and deletes
those that are named by nothing and older than ``older_than`` seconds. The age is what
makes it safe beside servers that are committing: a file written by a commit still
under way is seconds old, and a commit never takes an hour::

    table = catalog.load_table(("mldserver", "windows"))
    report = maintain(table, keep=16, older_than=3600.0)
    report.expired, report.orphans, report.orphan_bytes, report.young   # 0, 16, 2093056, 1

``mldserver table maintain`` runs it once (``--dry-run`` lists without deleting); a server
with the table sink runs it every ``table_maintenance_interval`` seconds (default one
hour, 0 to turn it off) in a thread, logged as ``table_maintained``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable
from urllib.parse import urlparse

if TYPE_CHECKING:
    from pyiceberg.table import Table

CONFLICT_RETRIES = 10


@dataclass
class Report:
    expired: int = 0  # snapshots expired
    files: int = 0  # files found under the table's location
    orphans: int = 0  # of them named by nothing and old enough: deleted (listed with dry_run)
    orphan_bytes: int = 0
    young: int = 0  # named by nothing but younger than older_than: kept (a commit may be under way)
    deleted: list[str] = field(default_factory=list)  # the orphans' locations (the first 100)


def maintain(table: "Table", *, keep: int, older_than: float, dry_run: bool = False,
             now: float | None = None) -> Report:
    """Expire snapshots past the last ``keep``, then remove orphan files older than
    ``older_than`` seconds (see the module docstring)."""
    report = Report()
    if not dry_run:
        table, report.expired = _expire(table, keep)
    named = {_key(location) for location in referenced(table)}
    cutoff = (time.time() if now is None else now) - older_than
    fs, root = _filesystem(table)
    scheme = urlparse(table.location()).scheme
    prefix = f"{scheme}://" if len(scheme) > 1 and scheme != "file" else ""  # s3://bucket/key, as the table names it
    from pyarrow.fs import FileSelector, FileType

    for info in fs.get_file_info(FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type != FileType.File:
            continue
        report.files += 1
        if _key(info.path) in named:
            continue
        if info.mtime is not None and info.mtime.timestamp() > cutoff:
            report.young += 1
            continue
        report.orphans += 1
        report.orphan_bytes += info.size or 0
        if len(report.deleted) < 100:
            report.deleted.append(prefix + info.path)
        if not dry_run:
            fs.delete_file(info.path)
    return report


def referenced(table: "Table") -> Iterable[str]:
    """Every file the table's current metadata names, directly or through its
    snapshots: metadata files (the current one and those it logs), statistics files,
    manifest lists, manifests, and the data and delete files they list (deleted
    entries too: a snapshot still kept may read them)."""
    metadata = table.metadata
    yield table.metadata_location
    for entry in metadata.metadata_log:
        yield entry.metadata_file
    for statistics in list(metadata.statistics) + list(getattr(metadata, "partition_statistics", []) or []):
        yield statistics.statistics_path
    io = table.io
    seen_manifests: set[str] = set()
    for snapshot in metadata.snapshots:
        yield snapshot.manifest_list
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            yield manifest.manifest_path
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                yield entry.data_file.file_path


def _expire(table: "Table", keep: int) -> tuple["Table", int]:
    """Snapshots past the last ``keep`` expired in one commit (retried on a conflict)."""
    from pyiceberg.exceptions import CommitFailedException

    for _ in range(CONFLICT_RETRIES):
        snapshots = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms)
        current = table.metadata.current_snapshot_id
        old = [s.snapshot_id for s in snapshots[:-keep] if s.snapshot_id != current] if keep else []
        if not old:
            return table, 0
        try:
            table.maintenance.expire_snapshots().by_ids(old).commit()
        except CommitFailedException:  # a server committed meanwhile: again, on its metadata
            table = table.refresh()
            continue
        return table.refresh(), len(old)
    return table, 0


def _filesystem(table: "Table"):
    """The table location's pyarrow file system (with the catalog's credentials) and
    the location as that file system names it."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    location = table.location()
    io = table.io if isinstance(table.io, PyArrowFileIO) else PyArrowFileIO(table.io.properties)
    scheme, netloc, path = io.parse_location(location)
    return io.fs_by_scheme(scheme, netloc), path


def _key(location: str) -> str:
    """A location as a listing names it: no scheme (``s3://b/k`` -> ``b/k``, ``file:///p``
    -> ``/p``)."""
    parsed = urlparse(location)
    if not parsed.scheme or len(parsed.scheme) == 1:  # a plain path (or a drive letter)
        return location
    if parsed.scheme == "file":
        return parsed.path
    return f"{parsed.netloc}{parsed.path}"
