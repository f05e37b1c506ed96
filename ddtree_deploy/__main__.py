"""``python -m ddtree_deploy`` is the same as the ``ddtree-deploy`` command."""

from .cli import main

main()
