"""``python -m mldserver ...``, the same as the ``mldserver`` command."""

from .cli import main

main()
