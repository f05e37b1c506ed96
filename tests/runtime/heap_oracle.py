"""The paper's tree build (Algorithm 1) and visibility matrix, re-implemented plainly as a test oracle.

Python ``heapq`` best-first search; scores accumulate in numpy float32 exactly like the kernels
(score(child) = score(parent) + lp[d][r], one fp32 rounding per edge). Two tie-breaks are offered:

* ``"parent"`` (the runtime's documented order): (-score, depth, parent's pop index, rank). Parents are popped
  in key order, so the parent's pop index stands for the parent's key.
* ``"rank_path"``: (-score, depth, rank path). Identical unless fp32 rounding makes children of differently
  scored parents tie; kept to show both agree on generic inputs.

The visibility matrix is the paper's O(N^2) numpy construction: row = parent's row plus the diagonal.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


@dataclass
class OracleTree:
    token: list[int]
    parent: list[int]
    depth: list[int]
    score: list[float]  # float32 values as Python floats

    @property
    def num_nodes(self) -> int:
        return len(self.token)


def heap_build(lp: np.ndarray, tok: np.ndarray, root_token: int, budget: int,
               tie_break: str = "parent") -> OracleTree:
    """lp, tok: [L, k] float32 / int for one request. Returns nodes in pop order (root first)."""
    lp = np.asarray(lp, dtype=np.float32)
    depth_l, k = lp.shape
    tree = OracleTree([int(root_token)], [-1], [0], [0.0])
    scores = [np.float32(0.0)]
    paths: list[tuple[int, ...]] = [()]

    def entry(score: np.float32, depth: int, parent: int, rank: int):
        tie = (parent, rank) if tie_break == "parent" else (paths[parent] + (rank,),)
        return (-float(score), depth, *tie, parent, rank, score)

    heap = [entry(np.float32(scores[0] + lp[0, 0]), 1, 0, 0)]
    while heap and len(tree.token) < budget + 1:
        item = heapq.heappop(heap)
        parent, rank, score = item[-3], item[-2], item[-1]
        depth = item[1]
        idx = len(tree.token)
        tree.token.append(int(tok[depth - 1, rank]))
        tree.parent.append(parent)
        tree.depth.append(depth)
        tree.score.append(float(score))
        scores.append(score)
        paths.append(paths[parent] + (rank,))
        if rank + 1 < k:
            heapq.heappush(heap, entry(np.float32(scores[parent] + lp[depth - 1, rank + 1]), depth, parent, rank + 1))
        if depth < depth_l:
            heapq.heappush(heap, entry(np.float32(score + lp[depth, 0]), depth + 1, idx, 0))
    return tree


def visibility(parent: list[int]) -> np.ndarray:
    """bool [n, n]: row i = row parent(i) plus the diagonal (parents precede children)."""
    n = len(parent)
    vis = np.zeros((n, n), dtype=bool)
    for i in range(n):
        if parent[i] >= 0:
            vis[i] = vis[parent[i]]
        vis[i, i] = True
    return vis
