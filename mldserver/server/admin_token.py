"""The admin endpoint's bearer token: where it comes from and how a request's is checked,
shared by the server (mldserver.server.admin) and its clients on the same machine
(``mldserver pause|resume|reload``, mldserver.ops.status)::

    read(Path("/run/secrets/mldserver-admin"), "--admin-token-file")
        -> "9f2c...e1"                       # the file's one line, surrounding whitespace stripped
        -> ConfigError("--admin-token-file /run/secrets/mldserver-admin: cannot read it (No such
                        file or directory): write the token there ...")
    in_state_dir(Path("./mldserver-state"))
        -> Token("Jx3...", Path("mldserver-state/admin-token"), generated=True)   # mode 0600
    matches("Bearer Jx3...", "Jx3...")  -> True                                  # constant time

A token is 16 to 4096 visible ASCII characters (what a Bearer header can carry; a
shorter one is guessable). The state directory's ``admin-token`` is generated once
(``secrets.token_urlsafe(32)``: 43 characters, 256 bits), readable by its owner only,
and kept across restarts; deleting it makes the next start generate another. The
token itself is never logged: only the file it is in.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path
from typing import NamedTuple

from ..errors import ConfigError
from ..base.durable import fsync_dir

FILE = "admin-token"  # in the state directory
MIN_LENGTH, MAX_LENGTH = 16, 4096
MAKE_ONE = "openssl rand -hex 32"


class Token(NamedTuple):
    """A token and the file it was read from (what the logs and messages name)."""

    value: str
    path: Path
    generated: bool = False  # written by this start (in the state directory)


def read(path: Path, what: str, fix: str | None = None) -> str:
    """The token in ``path``; a ConfigError naming ``what`` (the flag, or the state
    directory's file) and what to do (``fix``, else how to write one) when it cannot be
    read or is not a token."""
    fix = fix or f"write the token there (one line, as from `{MAKE_ONE} > {path}`), readable by its user"
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read it ({exc.strerror or exc}): {fix}") from None
    token = raw.decode("ascii", "replace").strip()
    if not token:
        raise ConfigError(f"{what} {path}: the file is empty: {fix}")
    if not all("!" <= c <= "~" for c in token) or not MIN_LENGTH <= len(token) <= MAX_LENGTH:
        raise ConfigError(f"{what} {path}: not a token (one line of {MIN_LENGTH} to {MAX_LENGTH} visible ASCII "
                          f"characters, no spaces): {fix}")
    return token


def in_state_dir(state_dir: Path) -> Token:
    """The state directory's token: the one there, else a new one written there (mode
    0600, never over another process's: written beside it, then linked into place)."""
    path = state_dir / FILE
    if not path.exists():
        token = secrets.token_urlsafe(32)
        temp = state_dir / f"_{FILE}.tmp-{os.getpid()}"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.fchmod(fd, 0o600)  # whatever the umask
                os.write(fd, token.encode() + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.link(temp, path)  # fails if another start wrote one meanwhile: that one is read below
            fsync_dir(state_dir)
            return Token(token, path, generated=True)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ConfigError(f"the admin token file {path}: cannot write it ({exc.strerror or exc}): make the "
                              f"state directory writable, or pass --admin-token-file FILE") from None
        finally:
            try:
                temp.unlink()
            except OSError:
                pass
    return Token(read(path, "the admin token file",
                      "delete it (the next start writes a new one), or pass --admin-token-file FILE"), path)


def for_client(token_file: str | None, state_dir: str) -> Token | None:
    """What ``mldserver pause|resume|reload`` send: ``--admin-token-file``'s token, else
    the state directory's if there is one (a server there generated it), else None."""
    if token_file:
        path = Path(token_file)
        return Token(read(path, "--admin-token-file"), path)
    path = Path(state_dir) / FILE
    if not path.exists():
        return None
    return Token(read(path, "the admin token file", "run this as the server's user, or pass --admin-token-file FILE"),
                 path)


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header (the scheme in any case)."""
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def matches(header: str | None, token: str) -> bool:
    """Does this ``Authorization`` header carry ``token``? Compared in constant time."""
    given = bearer(header)
    return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), token.encode())
