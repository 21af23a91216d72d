"""The project's handlers: ``mldserver serve --handler handlers.passthrough:Passthrough``.

The examples themselves ship in the package (``mldserver/examples/``); the modules
here give them their names in this folder, beside your own.
"""
