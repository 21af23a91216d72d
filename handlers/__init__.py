"""Example handlers: ``mldserver serve --handler handlers.passthrough:Passthrough``."""
