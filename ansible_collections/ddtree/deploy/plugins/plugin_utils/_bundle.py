# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller side of the ddtree.deploy actions: a host's bundle (plan and overlay), read from the directory
the task names, or made by the ddtree-deploy package on the controller for the inventory host."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import os
import tempfile
from pathlib import Path

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


def _read(path):
    try:
        with open(os.path.join(path, "plan.json")) as fh:
            plan = json.load(fh)
    except (OSError, ValueError) as exc:
        raise AnsibleActionFail("bundle %s: cannot read plan.json (%s)" % (path, exc))
    tar = os.path.join(path, "overlay.tar")
    data = b""
    if os.path.isfile(tar):
        with open(tar, "rb") as fh:
            data = fh.read()
    return plan, data


def _prepare(name, with_overlay):
    """The bundle of host ``name`` made with ddtree-deploy on the controller (its inventory, its snapshot store)."""
    try:
        from ddtree_deploy.ansible import bundle
        from ddtree_deploy.errors import DeployError
        from ddtree_deploy.inventory import resolve_host
    except ImportError as exc:
        raise AnsibleActionFail("no bundle given and ddtree-deploy is not importable on the controller (%s): "
                                "install it, or pass bundle" % exc)
    out = tempfile.mkdtemp(prefix="ddtree-bundle-")
    try:
        host = resolve_host(name)
        if with_overlay:
            return bundle.prepare(host, Path(out))
        return bundle.write_bundle(Path(out), host, None)
    except DeployError as exc:
        raise AnsibleActionFail("host %s: %s" % (name, exc))


class BundleAction(ActionBase):
    """Fill the module's ``plan`` (and ``overlay``) from ``bundle``, then run the module of the same name."""

    MODULE = None
    OVERLAY = False
    _VALID_ARGS = frozenset()

    def run(self, tmp=None, task_vars=None):
        result = super(BundleAction, self).run(tmp, task_vars)
        args = dict(self._task.args)
        bundle = args.pop("bundle", None)
        if not args.get("plan"):
            if bundle is None:
                bundle = str(_prepare((task_vars or {}).get("inventory_hostname"), self.OVERLAY))
            plan, tar = _read(os.path.expanduser(str(bundle)))
            args["plan"] = plan
            if self.OVERLAY:
                args["overlay"] = base64.b64encode(tar).decode()
        result.update(self._execute_module(module_name=self.MODULE, module_args=args, task_vars=task_vars))
        return result
