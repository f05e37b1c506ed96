"""Benchmarks and the end-to-end proof (bench/e2e); a package so that bench.e2e runs with python -m from the root."""
