"""Fleets on Ansible (#31): the ``ddtree.deploy`` collection (source in ``ansible_collections/ddtree/deploy``), built
from this package (``collection``), the per-host plans its modules run from (``bundle``), the inventory variables of
a host file (``hostvars``) and ``apply --engine ansible`` through ansible-runner (``engine``).

Nothing here imports Ansible at module level: ansible-core and ansible-runner are the optional extra ``ansible``.
"""
