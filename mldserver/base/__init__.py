"""The plumbing every part uses, importing none of them.

- ``config.py``: the settings, each with its Rule; ``load()`` for the file and the flags.
- ``logs.py``: structured logs, one JSON object per line.
- ``events.py``: the catalogue of every log event, its level and what it means.
- ``positions.py``: a shard position, parsed once at the edge.
- ``intervals.py``: which positions of a shard are committed, as a short list of ranges.
- ``durable.py``: files that survive a crash (whole or the old one, appended and fsynced).
- ``direct.py``: a large file written once past the page cache (``O_DIRECT``).
- ``commitlog.py``: a sink's commit log, one fsynced entry per committed window.
- ``deadletters.py``: what could not be processed, kept with its data.
- ``handoff.py``: ``Window``, ``JsonLines``, ``Sink``, ``Committed``: the coordinator's
  contract with the sinks.
- ``loans.py``: another process's shared memory read in place, given back when the last
  reference goes.
- ``malloc.py``: large buffers reused while batches flow, given back when they stop.
- ``backoff.py``: jittered exponential backoff and the policy every handler call follows.
- ``pipes.py``: the frames on the pipes to child processes (header, JSON, body).
- ``pieces.py``: a stream reader that hands out the transport's pieces, not copies.
- ``aws.py``: every AWS client of the server, opened in one place.
- ``preflight.py``: start-up checks of the machine (a path the server cannot use, refused).
- ``importer.py``: user code named ``module:attr``, imported strictly.
- ``pausing.py``: the pause gate every shard driver passes (``POST /pause``, ``/resume``).
- ``admin_token.py``: the admin endpoint's bearer token, for the server and its clients.
- ``secrets.py``: secrets kept out of errors, logs and ``check``.
- ``kcl_keys.py``: the daemon's property keys, generated from its jars (do not edit).
"""
