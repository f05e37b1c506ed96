"""Figures of ``bench`` and ``tune`` results (``--plot FILE``), drawn with matplotlib, an optional extra
(``pip install 'ddtree-deploy[plot]'``).

``bench``: tok/s against batch size for plain decoding, the DFlash chain and DDTree (the median of the reps, the
bar their min–max). ``tune``: the same for plain, the chain, each measured budget and the fitted schedule, and
beside it the drafter's acceptance by draft depth (the share of rounds reaching a depth whose draft there was
accepted, summed over the tree's ranks, from the server's own counters).

The file type follows the suffix (``.svg``, ``.png``, ``.pdf``). :func:`check_target` runs before anything is
measured, so a wrong path or a missing matplotlib costs no server restart.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import InputError

SUFFIXES = (".svg", ".png", ".pdf")
INSTALL = "pip install 'ddtree-deploy[plot]'"


def check_target(path: Path) -> Path:
    """The plot's path, checked before any measurement: a known suffix, an existing folder, matplotlib present."""
    if path.suffix.lower() not in SUFFIXES:
        raise InputError(f"--plot {path}: the file type comes from the suffix, one of {', '.join(SUFFIXES)}")
    if not path.parent.is_dir():  # a bare name's parent is "."
        raise InputError(f"--plot {path}: folder {path.parent} does not exist")
    if path.is_dir():
        raise InputError(f"--plot {path}: is a folder")
    _pyplot()
    return path


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise InputError(f"--plot needs matplotlib, which is not installed ({exc})", hint=INSTALL) from exc
    matplotlib.use("Agg", force=True)  # files only: never a window, whatever the environment says
    matplotlib.rcParams["svg.fonttype"] = "none"  # an SVG's labels stay text: searchable, and smaller
    import matplotlib.pyplot as plt

    return plt


def _series(rows: list[dict[str, Any]], key: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(str(r[key]), []).append(r)
    for cells in out.values():
        cells.sort(key=lambda c: c["batch"])
    return out


def _tok_s_axes(ax: Any, series: dict[str, list[dict[str, Any]]], title: str) -> None:
    for name, cells in series.items():
        xs = [c["batch"] for c in cells]
        ys = [c["tok_s"] for c in cells]
        lo = [max(0.0, c["tok_s"] - c.get("tok_s_min", c["tok_s"])) for c in cells]
        hi = [max(0.0, c.get("tok_s_max", c["tok_s"]) - c["tok_s"]) for c in cells]
        style = "--" if name in ("plain", "chain") else "-"
        ax.errorbar(xs, ys, yerr=[lo, hi], label=name, marker="o", linestyle=style, capsize=3)
    batches = sorted({c["batch"] for cells in series.values() for c in cells})
    if len(batches) > 1 and batches[-1] / max(1, batches[0]) >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("requests in flight (batch size)")
    ax.set_ylabel("tok/s (median; bar: min–max of the reps)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()


def bench_figure(res: dict[str, Any], path: Path) -> Path:
    """tok/s against batch size for each config of a ``bench`` result (hostbench.bench's dict)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _tok_s_axes(ax, _series(res["rows"], "config"),
                f"{res.get('host', '')}: plain / chain / DDTree (release {res.get('release', '?')})")
    return _save(fig, plt, path)


def acceptance_by_depth(profile: list[list[float]]) -> list[float]:
    """Per depth: the share of rounds reaching it whose draft there was accepted (any rank of the tree)."""
    return [round(sum(ranks), 6) for ranks in profile]


def tune_figure(res: dict[str, Any], path: Path) -> Path:
    """A ``tune`` result: tok/s by config and batch size with the fitted schedule, and acceptance by draft depth."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    rows = [dict(m, config=m["config"].replace("ddtree-", "b")) for m in res["measurements"]]
    series = _series(rows, "config")
    fitted = res.get("fitted_schedule") or res["schedule"]  # the table is the fit's, kept or not
    series[f"schedule {fitted}"] = [{"batch": r["batch"], "tok_s": r["schedule_tok_s"]} for r in res["table"]]
    _tok_s_axes(left, series, f"{res.get('host', '')}: tok/s by budget (release {res.get('release', '?')})")
    accepted = acceptance_by_depth(res.get("accept_profile") or [])
    if accepted:
        depths = list(range(1, len(accepted) + 1))
        right.bar(depths, accepted)
        right.set_xticks(depths, [str(d) for d in depths])
        right.set_ylim(0, 1)
    else:
        right.text(0.5, 0.5, "the server reported no per-depth acceptance", ha="center", va="center")
    right.set_xlabel("draft depth")
    right.set_ylabel("accepted / rounds reaching the depth")
    right.set_title("the drafter's acceptance by depth")
    right.grid(True, axis="y", alpha=0.3)
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: Path) -> Path:
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    try:
        fig.savefig(tmp, format=path.suffix.lstrip(".").lower())
        tmp.replace(path)  # never a half-written figure under the given name
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path
