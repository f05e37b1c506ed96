"""Model makers of the e2e runs (python -m bench.e2e.models.mk_*): tiny targets and drafters whose behaviour is known."""
