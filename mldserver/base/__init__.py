"""The plumbing every part uses, importing none of them: the settings (``config.py``),
structured logs (``logs.py``), positions in a shard (``positions.py``), durable files
(``durable.py``, ``commitlog.py``, ``deadletters.py``), what the coordinator hands a
sink (``handoff.py``), backoff and the handler-call policy (``backoff.py``), the pipes
to child processes (``pipes.py``, ``pieces.py``), the AWS clients (``aws.py``), the
start-up checks of the machine (``preflight.py``), ``module:attr`` imports
(``importer.py``), the pause gate (``pausing.py``), allocator tuning (``malloc.py``)
and the daemon's property names (``kcl_keys.py``).
"""
