"""The runtime's version (its own module, so the self-test can read it without importing the package)."""
__version__ = "0.1.0"
