"""What the GPU benchmarks' command lines share: comma lists of positive integers, a subset of a shape table, the
refusal without a GPU. Each failure is one line naming the benchmark and the flag, exit 2, nothing written."""
from __future__ import annotations

import sys


class BadArgs(Exception):
    """One line for stderr; the benchmark exits 2."""


def ints(text: str, flag: str, prog: str) -> tuple[int, ...]:
    """``--flag 1,8,32`` as positive integers."""
    try:
        vals = tuple(int(v) for v in text.split(","))
    except ValueError:
        vals = ()
    if not vals or any(v < 1 for v in vals):
        raise BadArgs(f"{prog}: --{flag} takes positive integers separated by commas, not {text!r}")
    return vals


def pick(table: dict, names: str | None, flag: str, prog: str) -> dict:
    """The rows of ``table`` a ``--flag a,b`` names (all of them without the flag)."""
    if not names:
        return table
    chosen = names.split(",")
    unknown = [n for n in chosen if n not in table]
    if unknown:
        raise BadArgs(f"{prog}: unknown {flag.rstrip('s')} {unknown[0]!r} (known: {', '.join(table)})")
    return {n: table[n] for n in chosen}


def need_cuda(prog: str, smoke: bool) -> None:
    import torch

    if not smoke and not torch.cuda.is_available():
        raise BadArgs(f"{prog}: needs a CUDA GPU (torch sees none); use --smoke for the CPU smoke run")


def refuse(exc: BadArgs) -> int:
    print(exc, file=sys.stderr)
    return 2
