"""The reports of the e2e runs: raw results from the device (gpu_run.sh) in, bench/results/*.{json,md} out.

Usage (repository root):
  python -m bench.e2e.report sweep FILES_DIR [--tag TAG] [--results bench/results] [--models /tmp/models]
                                   [--name lossless-speed] [--no-gaps]
  python -m bench.e2e.report hybrid OUT_JSON RAW.tgz [RAW.tgz ...]
  python -m bench.e2e.report spec-v2 CORRECTNESS_RAW SPEED_RAW EXPECTED_JSON OUT_STEM [APPLY_TRANSCRIPT_JSON]
  python -m bench.e2e.report speed-by-batch OUT_STEM RAW [RAW ...] [--notes NOTES.md] [--related KEY FILE]
  python -m bench.e2e.report hybrid-v2 OUT_STEM RAW [RAW ...] [--kernels KERNELS_JSON]
  python -m bench.e2e.report backends OUT_STEM LOSSLESS_RAW [LOSSLESS_RAW ...] [--speed RAW[,RAW...]] [--base 0.5.N]

Each report is one module of bench/e2e/reports/, named by what it measures, with its inputs, sections and outputs in
its docstring and a `main(argv)`:
  sweep           reports/sweep.py           one gpu_run.sh call on SGLang 0.5.11: lossless, the T > 0 fit, speed,
                                             round share
  hybrid          reports/hybrid.py          DDTree on hybrid GatedDeltaNet targets on 0.5.11 against every baseline
  spec-v2         reports/spec_v2.py         the proof of one spec-v2 base: lossless, speed-8b, the apply transcript
  speed-by-batch  reports/speed_by_batch.py  DDTree's speed against the chain per batch size (controlled acceptance)
  hybrid-v2       reports/hybrid_v2.py       hybrid GatedDeltaNet targets on the spec-v2 worker (0.5.17): kernels,
                                             lossless, the Qwen3.6-27B shape's rounds
  backends        reports/backends.py        DDTree on triton and FlashInfer at page sizes 1 / 16 / 64 (#28): lossless,
                                             the T > 0 fit, rounds against the chain of the same backend and page size
"""
from __future__ import annotations

import importlib
import sys

#: report kind -> its module under bench/e2e/reports (imported when run: each pulls only what it needs)
COMMANDS = {"sweep": "sweep", "hybrid": "hybrid", "spec-v2": "spec_v2", "speed-by-batch": "speed_by_batch",
            "hybrid-v2": "hybrid_v2", "backends": "backends"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        raise SystemExit(__doc__.split("\n\n")[1])
    return importlib.import_module(f"bench.e2e.reports.{COMMANDS[argv[0]]}").main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
