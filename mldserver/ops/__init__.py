"""Operations: the commands beside ``serve``. ``relay.py`` (``mldserver connect``, what
the daemon launches per shard; it imports nothing heavy), ``daemon.py`` (``mldserver
run``: the server with the real KCL daemon as its child), ``tether.py`` (what ties
that daemon to its server: it dies with it, a leftover is stopped, a restart is the
same KCL worker), ``properties.py`` (the
daemon's properties file), ``check.py`` (``mldserver check``), ``status.py``
(``mldserver status``, ``pause``, ``resume``, ``reload``: clients of the admin
endpoint), ``demo.py`` (``mldserver demo``) and ``bench/`` (``mldserver bench``).
"""
