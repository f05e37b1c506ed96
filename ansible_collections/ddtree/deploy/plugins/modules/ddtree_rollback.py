#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddtree_rollback
short_description: Roll a host back to its previous good release (or the installed package)
version_added: "0.1.0"
description:
  - The host-side C(ddtree-deploy rollback) under the host lock and its guardian, switch C(current) back, mark the
    release left bad, restart the server there and probe it.
  - In check mode nothing is written; the result says where the host would go.
options:
  plan:
    description:
      - The host's plan as C(ddtree-deploy) writes it. The action plugin fills it from O(bundle).
    type: dict
  bundle:
    description:
      - A bundle directory on the controller; without O(plan) and O(bundle) the action plugin makes the plan with
        C(ddtree-deploy) on the controller.
    type: path
  to:
    description:
      - The release id to go back to (default the recorded previous good release).
    type: str
  to_installed:
    description:
      - Go back to the installed package (no overlay).
    type: bool
    default: false
  break_lock:
    description:
      - Take the host lock even when another run holds it (that run is settled first).
    type: bool
    default: false
author:
  - ddtree-deploy maintainers (@ddtree-deploy)
"""

EXAMPLES = r"""
- name: Back to the previous good release
  ddtree.deploy.ddtree_rollback:
"""

RETURN = r"""
status:
  description: rolled-back, rollback-failed or unchanged.
  returned: always
  type: str
report:
  description: The host report, with the probe after the rollback.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ddtree.deploy.plugins.module_utils._host import ControllerWatch, HostFailure, rollback
from ansible_collections.ddtree.deploy.plugins.module_utils._module import PLAN_ARGS, failure, finish, need_plan


def main():
    spec = dict(PLAN_ARGS, to=dict(type="str"), to_installed=dict(type="bool", default=False),
                break_lock=dict(type="bool", default=False))
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True, mutually_exclusive=[("to", "to_installed")])
    plan = need_plan(module)
    plan["break_lock"] = bool(plan.get("break_lock") or module.params["break_lock"])
    try:
        if module.check_mode:
            out = rollback(plan, module.params["to"], module.params["to_installed"], check_mode=True)
        else:
            with ControllerWatch():
                out = rollback(plan, module.params["to"], module.params["to_installed"])
    except HostFailure as exc:
        failure(module, plan, exc)
    finish(module, out)


if __name__ == "__main__":
    main()
