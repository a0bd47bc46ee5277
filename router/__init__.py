"""The router process: request state, scheduling, grammar and batches. Its cache and text live
in ``cache/`` and ``text/``; ``api/`` is the separate HTTP process that talks to it."""
