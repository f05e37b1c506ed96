"""The README's attention backend x page-size table says what patches/ddtree/spec-v2/backends.py says.

Both tables are read as text and data (backends.py is pure data, loaded by path; the bases are the traits of each
base's folder, as the overlay's generated table gives them to bases.py), so this runs in ``make test-fast``; what
each row does on each base's real classes is tests/sglang_v2/test_v2_backends.py. The README names ranges of bases
open-ended ("0.5.14 and later", "from 0.5.22 on") where they reach the newest base, so a new base needs no edit there
unless it changes what the README says.
"""
from __future__ import annotations

from pathlib import Path

import spec_v2_tables

REPO = Path(__file__).resolve().parent.parent
SECTION = "### Attention backends and page sizes"


backends, BASES = spec_v2_tables.load("backends"), spec_v2_tables.bases_table()


def _readme_section() -> tuple[str, dict[str, list[str]]]:
    """The section's heading line and its table: first cell (as written) -> the other cells."""
    text = (REPO / "README.md").read_text()
    assert SECTION in text, f"README.md has no {SECTION!r} section"
    body = text[text.index(SECTION):]
    heading, body = body.split("\n", 1)
    body = body.split("\n#", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in body.splitlines():
        if not line.startswith("|") or set(line) <= set("|- "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return heading, rows


def _span(versions: tuple[str, ...], *, open_ended: str = "{} and later") -> str:
    """How the README names a run of consecutive bases: one version, ``A-B``, or, for a run up to the newest base,
    open-ended (``A and later``: the next base, ported from the newest, inherits its traits)."""
    spec_v2 = tuple(BASES)
    start = spec_v2.index(versions[0])
    assert spec_v2[start:start + len(versions)] == versions, f"not a run of consecutive bases: {versions}"
    if versions[-1] == spec_v2[-1]:
        return open_ended.format(versions[0])
    return versions[0] if len(versions) == 1 else f"{versions[0]}-{versions[-1]}"


def _row(rows: dict[str, list[str]], name: str) -> list[str]:
    hits = [cells for first, cells in rows.items() if first.split()[0] == f"`{name}`"]
    assert len(hits) == 1, f"README's backend table needs one row for `{name}` (backends.py has it): {list(rows)}"
    return hits[0]


def test_readme_backend_table_matches_backends_py():
    heading, rows = _readme_section()
    assert rows.pop("backend") == ["page size 1", "page size > 1"], "the table's columns"
    spec_v2 = tuple(BASES)
    assert f"(spec-v2 bases, {_span(spec_v2)})" in heading, heading
    for name, row in backends.BACKENDS.items():
        assert row.status in backends.STATUSES and row.mask in (backends.TREE_BLOCK, backends.FULL_ROWS), name
        assert bool(row.reason) == (row.status != backends.PROVEN), f"{name}: a reason exactly where refused"
        assert row.reads_context_columns == (row.mask == backends.FULL_ROWS), name
        page1, paged = _row(rows, name)
        if row.status == backends.PROVEN:
            assert page1.startswith("**proven on the H200**"), (name, page1)
        elif row.status == backends.WIRED_UNPROVEN:
            assert "wired, **not proven**" in page1 and "--speculative-ddtree-allow-unproven" in page1, (name, page1)
        else:
            assert page1.startswith("refused"), (name, page1)
        if row.base_trait:  # refused outright on the bases without the trait, which the cell names
            without = tuple(v for v in spec_v2 if not getattr(BASES[v], row.base_trait))
            assert without, f"{name}: its base trait is true on every base, so it gates nothing"
            named = _span(without, open_ended="from {} on")
            phrase = f"refused outright {named}" if named.startswith("from ") else f"refused outright on {named}"
            assert phrase in page1, (name, without, page1)
        if row.paged_wired:  # wired for page size > 1, not proven: behind the flag, and the cell says so
            assert "wired, **not proven**" in paged and "--speculative-ddtree-allow-unproven" in paged, (name, paged)
        elif row.page_sizes == (1,):
            assert paged.startswith("refused"), (name, paged)
        else:  # the cell names the other page sizes it runs with
            assert not paged.startswith("refused") and all(str(n) in paged for n in row.page_sizes if n != 1), (
                name, row.page_sizes, paged)
    known = {f"`{n}`" for n in backends.BACKENDS}
    others = [first for first in rows if first.split()[0] not in known]
    assert len(others) == 1 and others[0].startswith("any other"), f"one row for the backends not in the table: {others}"
    assert all(cell.startswith("refused") for cell in rows[others[0]]), rows[others[0]]
    assert "`patches/ddtree/spec-v2/backends.py`" in (REPO / "README.md").read_text().split(SECTION, 1)[1][:400], (
        "the section names the table the server reads")
