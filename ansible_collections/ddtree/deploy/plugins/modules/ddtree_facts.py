#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddtree_facts
short_description: Gather what ddtree-deploy knows of a host (facts and the installed package's manifest)
version_added: "0.1.0"
description:
  - The facts C(ddtree-deploy snapshot) gathers (Python and its ABI, glibc, torch and its CUDA, driver, GPUs, the
    versions of SGLang and its kernels and their pins, compiled files) as C(ansible_facts.ddtree), and the sha256,
    size and mode of every file of the installed package as C(manifest).
  - Hash caches are kept under the release root when O(release_root) is given (never in check mode).
options:
  site_packages:
    description: The site-packages directory SGLang is installed in.
    type: path
    required: true
  package:
    description: The package to describe.
    type: str
    default: sglang
  release_root:
    description: Where ddtree-deploy keeps its host-side caches (the host file's C(release_root)).
    type: path
  manifest:
    description: Also return the package's manifest (every file with its sha256).
    type: bool
    default: true
author:
  - ddtree-deploy maintainers (@ddtree-deploy)
"""

EXAMPLES = r"""
- name: Facts of the host's SGLang installation
  ddtree.deploy.ddtree_facts:
    site_packages: /opt/venv/lib/python3.11/site-packages
"""

RETURN = r"""
ansible_facts:
  description: C(ddtree), the facts record.
  returned: always
  type: dict
manifest:
  description: The package's manifest (files, links, dist-info).
  returned: when O(manifest) is true
  type: dict
"""

import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ddtree.deploy.plugins.module_utils._host import HostFailure, call


def main():
    module = AnsibleModule(argument_spec=dict(site_packages=dict(type="path", required=True),
                                              package=dict(type="str", default="sglang"),
                                              release_root=dict(type="path"), manifest=dict(type="bool", default=True)),
                           supports_check_mode=True)
    p = module.params
    root = None if module.check_mode else p["release_root"]
    try:
        facts = call(sys.executable, "facts", "facts", {"site_packages": p["site_packages"], "package": p["package"],
                                                        "release_root": root}, timeout=300)
        result = dict(changed=False, ansible_facts=dict(ddtree=facts))
        if p["manifest"]:
            result["manifest"] = call(sys.executable, "manifest", "manifest",
                                      {"site_packages": p["site_packages"], "package": p["package"],
                                       "release_root": root}, timeout=600)
    except HostFailure as exc:
        module.fail_json(msg=exc.message, kind=exc.kind)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
