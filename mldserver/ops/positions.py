"""``mldserver positions --source dynamodb:TABLE|kinesis:STREAM [--state-dir D] [--json]``:
where each shard of a source read by the server (``serve --source``) resumes, from its
saved positions (``<state-dir>/sources/<source>.json``, ``sources.positions``), read
without a server::

    $ mldserver positions --source kinesis:clicks
    kinesis:clicks  stream arn:aws:kinesis:us-east-1:...:stream/clicks  (mldserver-state/sources/kinesis_3aclicks.json)
      shardId-000000000000  SHARD_END (read to its end)
      shardId-000000000001  after 49590338271490256608559692538361571095921575989136588898
      shardId-000000000002  after 49590338271490256608559692538361571095921575989136588999 sub 2

    $ mldserver positions --source kinesis:clicks --json
    {"source": "kinesis:clicks", "stream": "arn:...", "path": "mldserver-state/sources/kinesis_3aclicks.json",
     "shards": {"shardId-000000000000": "SHARD_END", "shardId-000000000001": ["4959...8898", 0], ...}}

(one JSON object per line, per ``--source``). A source with no file yet: one line on
stderr naming it and the state dir, exit status 1; a source that does not parse or a
file that is not as the server writes it: exit 2.

With ``--lease-table TABLE`` the positions are read from the shards' lease items
(``serve --lease-table``), each with the server holding its lease::

    $ mldserver positions --source kinesis:clicks --lease-table clicks-leases
    kinesis:clicks  stream arn:aws:kinesis:us-east-1:...:stream/clicks  (lease table clicks-leases)
      shardId-000000000000  SHARD_END (read to its end)
      shardId-000000000001  after 49590338271490256608559692538361571095921575989136588898  (leased by host-a:...)
      shardId-000000000002  (no position yet)  (leased by host-b:977:0c1d2e3f)

(``--json``: ``"table"`` instead of ``"path"``, and ``"owners"``: shard id to the lease's
owner or null.)
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, TextIO

from ..base.positions import Position
from ..errors import ConfigError
from ..sources.positions import SHARD_END, SavedPositions, positions_path
from ..sources.shard_leases import ShardLeases
from ..sources.spec import SourceSpec


def main(sources: list[str], state_dir: str, as_json: bool, out: TextIO, err: TextIO,
         lease_table: str | None = None) -> int:
    """Print each source's saved positions; the exit status (1: one has none saved)."""
    specs = [SourceSpec.parse(text) for text in sources]  # a mistake: ConfigError (exit 2)
    if lease_table is not None:
        return asyncio.run(_leased(specs, lease_table, as_json, out, err))
    status = 0
    for spec in specs:
        if not positions_path(Path(state_dir), spec.text).exists():
            err.write(f"mldserver positions: no positions saved yet for {spec.text} in {state_dir} (no "
                      f"{positions_path(Path(state_dir), spec.text)}: has a server read it with --state-dir "
                      f"{state_dir}?)\n")
            status = 1
            continue
        saved = SavedPositions.open(Path(state_dir), spec.text)
        if as_json:
            out.write(json.dumps(_json(saved)) + "\n")
        else:
            out.write(_table(saved))
    return status


def _json(saved: SavedPositions) -> dict:
    shards = {}
    for shard_id in saved.shard_ids():
        at = saved.get(shard_id)
        shards[shard_id] = at if at == SHARD_END else at.to_json()  # type: ignore[union-attr]
    return {"source": saved.source, "stream": saved.stream, "path": str(saved.path), "shards": shards}


def _table(saved: SavedPositions) -> str:
    lines = [f"{saved.source}  stream {saved.stream or '(not known)'}  ({saved.path})"]
    ids = saved.shard_ids()
    width = max((len(s) for s in ids), default=0)
    for shard_id in ids:
        lines.append(f"  {shard_id:<{width}}  {_where(saved.get(shard_id))}")
    if not ids:
        lines.append("  (no shard saved yet)")
    return "\n".join(lines) + "\n"


async def _leased(specs: list[SourceSpec], table: str, as_json: bool, out: TextIO, err: TextIO) -> int:
    status = 0
    for spec in specs:
        try:
            async with ShardLeases(table, spec.text) as leases:
                shards = await leases.snapshot()
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"mldserver positions: cannot read the lease table {table} ({type(exc).__name__}: "
                              f"{exc}): check the region, the credentials and the endpoint "
                              f"(AWS_ENDPOINT_URL_DYNAMODB)") from None
        if not shards:
            err.write(f"mldserver positions: no shard lease of {spec.text} in the lease table {table} (has a server "
                      f"read it with --lease-table {table}?)\n")
            status = 1
            continue
        stream = next((s for _, _, s in shards.values() if s), None)
        if as_json:
            doc = {"source": spec.text, "stream": stream, "table": table,
                   "shards": {k: at.to_json() if isinstance(at, Position) else at for k, (at, _, _) in shards.items()},
                   "owners": {k: owner for k, (_, owner, _) in shards.items()}}
            out.write(json.dumps(doc) + "\n")
            continue
        lines = [f"{spec.text}  stream {stream or '(not known)'}  (lease table {table})"]
        width = max(len(s) for s in shards)
        for shard_id, (at, owner, _) in shards.items():
            lines.append(f"  {shard_id:<{width}}  {_where(at)}" + (f"  (leased by {owner})" if owner else ""))
        out.write("\n".join(lines) + "\n")
    return status


def _where(at: Any) -> str:
    if at is None:
        return "(no position yet)"
    if at == SHARD_END:
        return "SHARD_END (read to its end)"
    return f"after {at.text}" + (f" sub {at.sub}" if at.sub else "")
