"""The experiments behind the ``fedgan`` commands: simulate, compare, the debugging task, evaluate."""
