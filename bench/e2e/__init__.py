"""The end-to-end proof on a GPU machine: the driver, the model makers, the reports (run as python -m bench.e2e.*)."""
