"""The node agent: starts, queues, supervises, stops and reports runs on one node.

Reached through the hidden ``higgsfield invoker ...`` command group; it never
imports the control side nor torch (see ``.importlinter``). This file makes the
directory a regular package, so the import contracts see its modules.
"""
