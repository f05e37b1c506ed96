# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
name: ddtree_hosts
short_description: ddtree-deploy host files as an Ansible inventory
version_added: "0.1.0"
description:
  - Reads a ddtree-deploy inventory directory (one YAML host file per host, and C(groups.yaml)), so that
    C(ansible-inventory -i hosts/ --list) shows the hosts ddtree-deploy deploys to, with their groups.
  - Each host file is validated by ddtree-deploy itself (the same rules and messages as C(ddtree-deploy hosts check));
    a bad file is an error naming the file and field.
  - Each host gets the connection variables that reach it as ddtree-deploy does (address, port, user, key, the host
    file's known_hosts with strict checking, its Python as the interpreter).
  - Enable it in C(ansible.cfg) (C([inventory] enable_plugins = ddtree.deploy.ddtree_hosts, ...)) or with
    C(ANSIBLE_INVENTORY_ENABLED). The C(examples/) folder of an inventory is never read, as by ddtree-deploy.
requirements:
  - ddtree-deploy (the Python package) on the controller
author:
  - ddtree-deploy maintainers (@ddtree-deploy)
"""

EXAMPLES = r"""
# ansible.cfg
# [inventory]
# enable_plugins = ddtree.deploy.ddtree_hosts
#
# ansible-inventory -i hosts/ --list
"""

import os

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin

try:
    import yaml
except ImportError:  # pragma: no cover (ansible-core depends on PyYAML)
    yaml = None


def _looks_like_host_file(path):
    try:
        with open(path) as fh:
            doc = yaml.safe_load(fh)
    except Exception:
        return False
    return isinstance(doc, dict) and "name" in doc and "release_root" in doc


class InventoryModule(BaseInventoryPlugin):
    NAME = "ddtree.deploy.ddtree_hosts"

    def verify_file(self, path):
        if not path.endswith((".yaml", ".yml")) or not os.path.isfile(path):
            return False
        if os.path.basename(os.path.dirname(os.path.abspath(path))) == "examples":
            return False
        if os.path.basename(path) == "groups.yaml":
            return True
        return _looks_like_host_file(path)

    def parse(self, inventory, loader, path, cache=True):
        super(InventoryModule, self).parse(inventory, loader, path, cache)
        try:
            from pathlib import Path

            from ddtree_deploy.ansible.hostvars import host_vars
            from ddtree_deploy.errors import DeployError
            from ddtree_deploy.inventory import Inventory, _read_groups, load_host_file
        except ImportError as exc:
            raise AnsibleParserError("%s: reading ddtree-deploy host files needs the ddtree-deploy package on the "
                                     "controller (%s)" % (path, exc))
        try:
            if os.path.basename(path) == "groups.yaml":
                found = Inventory([(Path(path).parent, "ansible")])
                _read_groups(Path(path), found)
                for group, members in found.groups.items():
                    self.inventory.add_group(group)
                    for name in members:
                        self.inventory.add_host(name, group=group)
                return
            host = load_host_file(Path(path), "ansible")
        except DeployError as exc:
            raise AnsibleParserError(str(exc.message))
        self.inventory.add_host(host.name)
        for group in host.groups:
            self.inventory.add_group(group)
            self.inventory.add_host(host.name, group=group)
        for key, value in host_vars(host).items():
            self.inventory.set_variable(host.name, key, value)
