"""Secrets kept out of every output: configuration errors, log lines, ``check``.

A configuration holds secrets where users put a catalog's or Spark's credentials:
``[table_catalog]`` (a database password in its ``uri``, ``s3.secret-access-key``,
``token``, ``credential``) and ``[spark_conf]`` (``spark.hadoop.fs.s3a.secret.key``).
``learn(settings)`` notes their values: the value of every key that names a secret
(password, secret, token, credential, key, auth, private), the secret half of a REST
catalog's ``credential = "CLIENT_ID:CLIENT_SECRET"`` (an OAuth error may quote it alone),
and the password of every URI (``postgresql://app:PASSWORD@db/lake``). From then on ``scrub(text)`` replaces each with
``***``; the log formatters and the command line's error lines pass through it, so a
driver's error that quotes the URI it was given prints no password either::

    learn(Settings(table_catalog={"uri": "postgresql+psycopg2://app:hunter22@db:5432/lake",
                                  "s3.secret-access-key": "wJalrXUtnFEMI/K7MDENG"}))
    scrub("cannot connect to postgresql+psycopg2://app:hunter22@db:5432/lake")
        -> "cannot connect to postgresql+psycopg2://app:***@db:5432/lake"
    redacted({"uri": "postgresql+psycopg2://app:hunter22@db:5432/lake", "type": "sql"})
        -> {"uri": "postgresql+psycopg2://app:***@db:5432/lake", "type": "sql"}

Values shorter than ``SHORTEST`` characters are not learnt (starring every "1" in a
log would hide more than it protects). What is learnt is kept for the process's life
(a reload that changes a secret adds the new one).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

MASK = "***"
SHORTEST = 4
_SECRET_KEY = re.compile(r"pass|secret|token|credential|private|auth|(^|[-_.])key($|[-_.])", re.IGNORECASE)
_URI_PASSWORD = re.compile(r"[A-Za-z][\w+.-]*://[^:/@\s]*:([^@\s/]+)@")

_known: set[str] = set()
_ordered: list[str] = []  # longest first: a secret that contains another is starred whole


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def values_in(mapping: dict | None) -> Iterable[str]:
    """The secret values of one settings table (nested tables too)."""
    for key, value in (mapping or {}).items():
        if isinstance(value, dict):
            yield from values_in(value)
            continue
        text = str(value)
        if is_secret_key(str(key)):
            yield text
            if str(key).lower().endswith("credential") and ":" in text:
                yield text.partition(":")[2]  # a REST catalog's CLIENT_ID:CLIENT_SECRET: the secret alone too
        yield from (m.group(1) for m in _URI_PASSWORD.finditer(text))


def learn_values(values: Iterable[str]) -> None:
    global _ordered
    new = {v for v in values if len(v) >= SHORTEST} - _known
    if new:
        _known.update(new)
        _ordered = sorted(_known, key=len, reverse=True)


def learn(settings: Any) -> None:
    """Note the secrets ``settings`` (a ``config.Settings``) holds (see the module docstring)."""
    learn_values(values_in(settings.table_catalog))
    learn_values(values_in(settings.spark_conf))
    for text in (settings.sink, settings.spark_master, settings.timer_store):
        if text:
            learn_values(m.group(1) for m in _URI_PASSWORD.finditer(str(text)))


def scrub(text: str) -> str:
    """``text`` with every learnt secret, and any URI's password, starred."""
    if _ordered:
        for secret in _ordered:
            if secret in text:
                text = text.replace(secret, MASK)
    if "://" in text and "@" in text:
        text = _URI_PASSWORD.sub(lambda m: m.group(0).replace(m.group(1), MASK), text)
    return text


def redacted(mapping: dict | None) -> dict:
    """A settings table fit to print: secret keys' values and URIs' passwords starred."""
    out: dict[str, Any] = {}
    for key, value in (mapping or {}).items():
        if isinstance(value, dict):
            out[key] = redacted(value)
        elif is_secret_key(str(key)):
            out[key] = MASK
        else:
            out[key] = scrub(str(value)) if isinstance(value, str) else value
    return out
