"""Stands in for pip's get-pip.py where ansible-test cannot download it (no network but the package registry).

ansible-test makes each sanity test's virtual environment without pip and runs its cached ``get_pip_<version>.py``
with pip's own arguments (the pinned pip to install, ``--no-setuptools`` / ``--no-wheel``). This does the same from
what is here: pip from the Python's own bundled wheel (``ensurepip``, standard library), then, in a process of its
own, ``pip install`` of what get-pip was asked for, from the configured package index."""
import subprocess
import sys

# in a process of its own: ensurepip points PIP_CONFIG_FILE at /dev/null for its own pip run, which would hide the
# index settings from the install below
subprocess.check_call([sys.executable, "-m", "ensurepip"])
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args]))
