# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action of ddtree.deploy.ddtree_probe: reads the host's bundle on the controller, then runs the module."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.ddtree.deploy.plugins.plugin_utils._bundle import BundleAction


class ActionModule(BundleAction):
    MODULE = "ddtree.deploy.ddtree_probe"
    OVERLAY = False
