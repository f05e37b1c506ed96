"""One module per report of the e2e runs, each named by what it measures; `python -m bench.e2e.report KIND ...` runs
one (bench/e2e/report.py maps the kinds to these modules)."""
