"""A tiny pure-Python stand-in for a tree kernel: depth of each node given parent indices (-1 = root)."""


def tree_depth(parents: list[int]) -> list[int]:
    depth = [0] * len(parents)
    for i, p in enumerate(parents):
        depth[i] = 0 if p < 0 else depth[p] + 1
    return depth
