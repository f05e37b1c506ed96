# The frame every remote program starts with: the reply protocol and small shared helpers. Stdlib only, and it
# must run on any Python >= 3.8 a host may use for SGLang.
import json as _json
import os as _os
import sys as _sys
import traceback as _traceback

_MARKER = "@@DDTREE-RESULT@@"


class Failure(Exception):
    """An expected failure with a message for the user (not a crash)."""

    def __init__(self, message, kind="error"):
        Exception.__init__(self, message)
        self.kind = kind


def server_env(root, env):
    """The environment the server runs with: ours, the host file's `env`, and PYTHONPATH=<root>/current first.

    Shared by the server launcher and the probe, so the probe inspects exactly what the server imports.
    """
    full = dict(_os.environ)
    full.update({k: str(v) for k, v in (env or {}).items()})
    current = _os.path.join(root, "current")
    rest = full.get("PYTHONPATH", "")
    full["PYTHONPATH"] = current + (_os.pathsep + rest if rest else "")
    return full


def _ddtree_main(ops):
    request = _json.loads(_PAYLOAD.decode())  # noqa: F821  (_PAYLOAD is injected by the boot line)
    op = request["op"]
    try:
        if op not in ops:
            raise Failure("unknown op %r (have: %s)" % (op, ", ".join(sorted(ops))), "usage")
        reply = {"ok": True, "result": ops[op](**request["args"])}
    except Failure as exc:
        reply = {"ok": False, "error": str(exc), "kind": exc.kind}
    except Exception:
        reply = {"ok": False, "error": _traceback.format_exc(), "kind": "crash"}
    _sys.stdout.flush()
    _sys.stdout.write("\n" + _MARKER + _json.dumps(reply) + "\n")
    _sys.stdout.flush()
