#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddtree_release
short_description: Deploy a DDTree overlay as a release, probe it, roll back when it fails
version_added: "0.1.0"
description:
  - Runs the host-side transaction of C(ddtree-deploy apply) in one host process that holds the host lock through
    the same guardian as the CLI, build a release from the overlay, switch C(current) to it, restart the server,
    probe it, and roll back to the last good release when the probe fails.
  - When the active release already holds the overlay, the server runs the host file's flags and the probe passes,
    nothing changes (C(changed=false)).
  - If the controller goes away mid-run (killed, cut), the module process ends and the guardian settles the run on
    the host as it does for the CLI, back to the last good release with the server restarted there.
  - In check mode nothing on the host is written; with diff mode the files the new release would change are shown.
options:
  plan:
    description:
      - The host's plan as C(ddtree-deploy) writes it (C(plan.json) of a bundle), with the overlay's file list.
      - The action plugin fills it from O(bundle).
    type: dict
  overlay:
    description:
      - The overlay as a tar stream, base64-encoded. The action plugin fills it from O(bundle).
    type: str
  bundle:
    description:
      - A bundle directory on the controller (C(plan.json) and C(overlay.tar)), as C(ddtree-deploy apply --engine ansible)
        writes one per host. Without O(plan) and O(bundle), the action plugin builds the bundle itself with the
        C(ddtree-deploy) package installed on the controller, for the host named as the inventory host.
    type: path
  break_lock:
    description:
      - Take the host lock even when another run holds it (that run is settled first).
    type: bool
    default: false
  force:
    description:
      - Deploy a new release even when the active one already holds this overlay and passes its probe.
    type: bool
    default: false
requirements:
  - The host's Python (the one SGLang runs under), standard library only.
  - C(ddtree-deploy) on the controller, to build bundles.
author:
  - ddtree-deploy maintainers (@ddtree-deploy)
"""

EXAMPLES = r"""
- name: Deploy the overlay that ddtree-deploy built for this host
  ddtree.deploy.ddtree_release:
    bundle: "{{ ddtree_bundle_dir }}/{{ inventory_hostname }}"
  register: deployed
"""

RETURN = r"""
status:
  description: What happened, as the CLI's recap says it.
  returned: always
  type: str
  sample: rolled-back
release:
  description: The release the host runs now (or the one that was deployed and rolled back).
  returned: always
  type: str
rolled_back_to:
  description: The release the host went back to, null for the installed package.
  returned: when rolled back
  type: str
report:
  description: The host report (the CLI's ApplyReport as a dictionary, probe stages included).
  returned: always
  type: dict
"""

import base64

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ddtree.deploy.plugins.module_utils._host import ControllerWatch, HostFailure, apply
from ansible_collections.ddtree.deploy.plugins.module_utils._module import PLAN_ARGS, failure, finish, need_plan


def main():
    spec = dict(PLAN_ARGS, overlay=dict(type="str", no_log=True), break_lock=dict(type="bool", default=False),
                force=dict(type="bool", default=False))
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    plan = need_plan(module)
    if "overlay" not in plan:
        module.fail_json(msg="the plan for host %s carries no overlay" % plan.get("host"))
    plan["force"] = bool(plan.get("force") or module.params["force"])
    plan["break_lock"] = bool(plan.get("break_lock") or module.params["break_lock"])
    tar = base64.b64decode(module.params["overlay"] or "")
    try:
        if module.check_mode:
            out = apply(plan, tar, check_mode=True)
        else:
            with ControllerWatch():
                out = apply(plan, tar)
    except HostFailure as exc:
        failure(module, plan, exc)
    finish(module, out)


if __name__ == "__main__":
    main()
