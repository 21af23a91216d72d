"""``mldserver redrive``: the dead-lettered records of a running server sent again
through its current handler (after a fix and ``mldserver reload``), by ``POST
/redrive`` on its admin endpoint (mldserver.server.redrive says what is redriven and
how). One line, and the exit status::

    $ mldserver redrive --state-dir /var/lib/mldserver
    redriven 3, failed again 1, left 2
    mldserver redrive: failed again: shardId-000000000001 4959...:0 ValueError: bad order
    $ echo $?
    1

``redriven``: dead letters whose records' rows are committed, removed from their file;
``failed again``: kept, their records having failed again (each named on stderr, the
first 10); ``left``: kept otherwise (not redrivable: rows, timers, malformed records;
or not committed within ``--timeout``, said on stderr). Exit 0 when nothing failed
again and everything redriven was committed, 1 otherwise, 2 when it could not run:
no server answers, the token is missing or wrong, the server is paused or redriving
already (one line on stderr, naming what to do).

The admin endpoint, its token and the state directory come from the flags, else from
``--config`` (the server's TOML: ``admin``, ``state_dir``, ``admin_token_file``), else
the defaults (127.0.0.1:7071, ./mldserver-state). ``--json`` prints the server's whole
answer instead of the line.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any, NamedTuple, TextIO

from ..server import admin_token
from .status import request

SHOWN = 10  # failures named on stderr


class Failed(Exception):
    """The redrive could not run (exit status 2): the one line to print."""


class Target(NamedTuple):
    admin: str | None
    state_dir: str
    token_file: str | None


def run(target: Target, timeout: float, out: TextIO, err: TextIO, *, as_json: bool = False) -> int:
    token = admin_token.for_client(target.token_file, target.state_dir)
    path = "/redrive?" + urllib.parse.urlencode({"timeout": f"{timeout:g}"})
    status, answer = request(target.admin, "POST", path, None if token is None else token.value,
                             timeout=timeout + 60)
    if status == 401:
        raise Failed(f"the admin endpoint refused the token in {token.path}: pass the server's own with "
                     f"--admin-token-file FILE, or --state-dir DIR (the server's, where it wrote admin-token)"
                     if token is not None else
                     "the admin endpoint needs its token, and none was found: pass --state-dir DIR (the "
                     "server's, where it wrote admin-token) or --admin-token-file FILE")
    if status != 200 or not isinstance(answer, dict) or "redriven" not in answer:
        error = answer.get("error", answer) if isinstance(answer, dict) else answer
        raise Failed(f"{error} (HTTP {status})")
    if as_json:
        out.write(json.dumps(answer) + "\n")
    else:
        out.write(summary(answer) + "\n")
        for failure in answer["failures"][:SHOWN]:
            err.write(f"mldserver redrive: failed again: {failure['shard_id']} {failure['sequence_number']}:"
                      f"{failure['sub_sequence_number']} {failure['error']}\n")
        if answer["not_committed"]:
            err.write(f"mldserver redrive: {answer['not_committed']} dead letters kept: their rows were not "
                      f"committed within {timeout:g} s (the sink failing? see the server's log); a later "
                      f"redrive sends them again (a duplicate at worst)\n")
    return 1 if answer["failed_again"] or answer["not_committed"] else 0


def summary(answer: dict[str, Any]) -> str:
    return f"redriven {answer['redriven']}, failed again {answer['failed_again']}, left {answer['left']}"
