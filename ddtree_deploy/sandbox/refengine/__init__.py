"""DDTree reference engine: a GPU-less, SGLang-shaped HTTP server that really decodes.

Why it exists: sandbox hosts and CI have no GPU, so they cannot run SGLang, yet the deployment
flow (overlay release, probe, rollback) must be exercised against a server whose output depends
on the overlay's DDTree runtime. This package decodes tiny seeded models on CPU with that runtime,
so a broken overlay produces a failed start-up or wrong tokens, exactly what the probe looks for.

It is copied verbatim into each sandbox host's Python environment as the top-level package
``ddtree_refengine``; therefore it imports only the stdlib and torch, and only relatively.
"""

__version__ = "0.1.0"
