"""One thin handler per method: decode the message, call the method's core, encode the reply.

Each module has ``ACTION`` (its message type, e.g. ``train.gswgan``) and ``handle(message, context)``;
``client/app.py`` registers every handler the registry (``common/methods``) names.
"""
