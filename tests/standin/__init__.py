"""The stand-in server for deploy tests and the helpers that put it on a sandbox host."""
