"""Vendored sample runtime: what a patch set copies whole into the overlay."""

from .kernels.tree import tree_depth

__all__ = ["tree_depth"]
