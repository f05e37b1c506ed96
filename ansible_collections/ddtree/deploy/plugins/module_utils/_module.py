# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the ddtree.deploy modules share: the plan argument and turning a host report into a module result."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

PLAN_ARGS = dict(
    plan=dict(type="dict"),
    bundle=dict(type="path"),
)


def need_plan(module):
    plan = module.params.get("plan")
    if not plan:
        module.fail_json(msg="no plan: give plan, or bundle (read by the action plugin on the controller; run the "
                             "module through its action, as a task of ddtree.deploy, not with a raw module call)")
    return dict(plan)


def finish(module, out):
    """exit_json when the host report is good, else fail_json with the same fields (msg: the report's message)."""
    rep = out["report"]
    rep["ok"] = rep["status"] in ("ok", "unchanged", "dry-run")
    fields = dict(changed=bool(out.get("changed")), report=rep, status=rep["status"], release=rep.get("release"),
                  rolled_back_to=rep.get("rolled_back_to"))
    if out.get("diff") is not None and module._diff:
        fields["diff"] = out["diff"]
    if rep["ok"]:
        module.exit_json(msg=rep.get("message") or rep["status"], **fields)
    module.fail_json(msg=rep.get("message") or rep["status"], **fields)


def failure(module, plan, exc):
    """A refusal before anything changed, or a run the host settled (its guardian), as a failed module result."""
    settled = exc.data.get("settled")
    status = "refused" if exc.kind in ("lock", "drift", "missing", "usage") else "failed"
    rep = {"host": plan.get("host"), "status": status, "ok": False, "message": exc.message,
           "exit_code": 6 if exc.kind == "lock" else 1, "release": None, "previous": None, "rolled_back_to": None,
           "push": None, "probe": None, "rollback_probe": None, "timings": {}, "details": {"kind": exc.kind}}
    if settled:
        rep["details"]["settled"] = settled
        if settled.get("action") == "rolled-back":
            rep["rolled_back_to"] = settled.get("to")
    module.fail_json(msg=exc.message, kind=exc.kind, report=rep, status=status, changed=bool(settled))
