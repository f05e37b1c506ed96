#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ddtree_probe
short_description: Probe a host's DDTree server as it runs
version_added: "0.1.0"
description:
  - The probe stages of C(ddtree-deploy probe) (overlay in use, kernel self-test, start-up and /health, generation
    against the recorded baseline) against the server as it runs. Reads only; never changes the host.
  - Fails when a stage fails.
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
  live_window:
    description:
      - Seconds between two reads of the server's DDTree counters (C(sglang:ddtree_*) on C(/metrics), read on the host)
        after the probe; the reads are returned as RV(live_window) for C(ddtree-deploy probe) to turn into the live
        accept length and decode tok/s. V(0) skips them.
    type: float
    default: 1.0
  metrics_prefix:
    description:
      - The metric families read for O(live_window).
    type: str
    default: "sglang:ddtree_"
author:
  - ddtree-deploy maintainers (@ddtree-deploy)
"""

EXAMPLES = r"""
- name: Probe the server
  ddtree.deploy.ddtree_probe:
"""

RETURN = r"""
probe:
  description: The probe result, its stages with their status, seconds and detail.
  returned: always
  type: dict
active:
  description: The active release (null for the installed package).
  returned: always
  type: str
live_window:
  description:
    - The two reads of the server's DDTree counters, O(live_window) seconds apart (C(before), C(after), C(seconds)
      timed on the host), or C(error) with the reason the server's counters could not be read; null when
      O(live_window=0). A server that does not answer never fails the probe for this.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ddtree.deploy.plugins.module_utils._host import HostFailure, failed_stage, metrics_window, probe
from ansible_collections.ddtree.deploy.plugins.module_utils._module import PLAN_ARGS, need_plan


def main():
    module = AnsibleModule(argument_spec=dict(PLAN_ARGS, live_window=dict(type="float", default=1.0),
                                              metrics_prefix=dict(type="str", default="sglang:ddtree_")),
                           supports_check_mode=True)
    plan = need_plan(module)
    try:
        result, state = probe(plan)
    except HostFailure as exc:
        module.fail_json(msg=exc.message, kind=exc.kind)
    window = module.params["live_window"]
    live = metrics_window(plan, module.params["metrics_prefix"], window) if window and window > 0 else None
    if result["ok"]:
        module.exit_json(changed=False, probe=result, active=state.get("active"), live_window=live, msg="probe passed")
    stage = failed_stage(result) or {}
    module.fail_json(changed=False, probe=result, active=state.get("active"), live_window=live,
                     msg="probe stage %s failed: %s" % (stage.get("name"), stage.get("detail")))


if __name__ == "__main__":
    main()
