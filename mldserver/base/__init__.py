"""The plumbing several layers use, importing none of them. A module one part uses
lives beside that part (``server/preflight.py``, ``shard/pausing.py``), not here.

- ``config.py``: the settings, each with its Rule; ``load()`` for the file and the flags.
- ``logs.py``: structured logs, one JSON object per line, and the events they may name:
  ``events.toml``, the catalogue (data) of every log event, its levels and what it means.
- ``positions.py``: a shard position, parsed once at the edge.
- ``intervals.py``: which positions of a shard are committed, as a short list of ranges.
- ``durable.py``: files that survive a crash (whole or the old one, appended and fsynced).
- ``direct.py``: a large file written once past the page cache (``O_DIRECT``).
- ``deadletters.py``: what could not be processed, kept with its data.
- ``handoff.py``: ``Window``, ``JsonLines``, ``Sink``, ``Committed``: the coordinator's
  contract with the sinks.
- ``backoff.py``: jittered exponential backoff and the policy every handler call follows.
- ``aws.py``: every AWS client of the server, opened in one place.
- ``importer.py``: user code named ``module:attr``, imported strictly.
- ``secrets.py``: secrets kept out of errors, logs and ``check``.
"""
