"""One module per report of the e2e runs, each named by what it measures; `python -m bench.e2e.report KIND ...` runs
one (bench/e2e/report.py maps the kinds to these modules)."""
from __future__ import annotations

import argparse
from pathlib import Path


def stem_and_raws(kind: str, description: str, raws_help: str) -> argparse.ArgumentParser:
    """The command line of a report written to STEM.json and STEM.md from raw results (TAG-raw.tgz or folders)."""
    ap = argparse.ArgumentParser(prog=f"python -m bench.e2e.report {kind}", description=description)
    ap.add_argument("stem", type=Path, help="writes STEM.json and STEM.md")
    ap.add_argument("raws", type=Path, nargs="+", help=raws_help)
    return ap
