"""The launch line checked against the release it will run, before the switch.

``apply`` pushes a release built on the host's installed SGLang; before ``current`` moves to it, the full argument
list the server will be started with (the host file's ``server.command`` with DDTree's flags, as ``server`` fills it)
is parsed on the host by that release's own ``ServerArgs`` parser (``ServerArgs.add_cli_args`` into the parser
``prepare_server_args`` builds), in a short subprocess that imports ``sglang.srt.server_args`` from the release and
does no GPU work. A flag the release does not know (a typo, a flag a newer SGLang removed) or a value it refuses
stops the deploy there, naming the flag and, for the known renames, the new spelling, while the old server keeps
serving (a release pushed for it is removed again: deploy.py). ``apply --fix-flags`` writes the new spelling of the
known renames into the host file first (:func:`plan_flag_fix`; ``--dry-run`` shows the edit and writes nothing). A
command that does not start SGLang's own entry point (``-m sglang.launch_server``, ``sglang serve``) is not parsed,
and says so. The baseline restart (``baseline.record_baseline``: DDTree off, the active release or
the installed SGLang) is checked the same way before it stops anything.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from typing import Any

from packaging.version import InvalidVersion, Version

from .errors import InputError, OperationFailed
from .hoststate import ReleaseState

#: Flags SGLang removed, -> (the new spelling, the first release without the old one).
RENAMED = {
    "--mamba-scheduler-strategy": ("--mamba-radix-cache-strategy", "0.5.20"),
    "--speculative-dflash-draft-window-size": ("--speculative-draft-window-size", "0.5.20"),
}
MARK = "DDTREE-LAUNCH-CHECK "
#: The host-file fields that hold launch flags (``server.command`` has the user's, ``server.ddtree_flags`` DDTree's).
FLAG_FIELDS = ("command", "ddtree_flags")


def _removed_by(version: str | None) -> dict[str, str]:
    """The renames in effect at SGLang ``version``: old flag -> new spelling (none for an unknown version)."""
    try:
        v = Version(str(version))
    except InvalidVersion:
        return {}
    return {old: new for old, (new, since) in RENAMED.items() if v >= Version(since)}


def renamed_in(text: str, version: str | None) -> tuple[str, list[str]]:
    """``text`` (a launch line) with every flag SGLang ``version`` removed written in its new spelling, as a flag word
    (``--old`` or ``--old=value``) and nowhere else; and the renames made, as ``old -> new``. Quoting, spacing and
    every other word stay as they were."""
    done: list[str] = []
    for old, new in _removed_by(version).items():
        pattern = re.compile(r"(?<![^\s'\"])" + re.escape(old) + r"(?=$|[\s='\"])")
        text, n = pattern.subn(new, text)
        if n:
            done.append(f"{old} -> {new}")
    return text, done


@dataclasses.dataclass(frozen=True)
class FlagFix:
    """What ``apply --fix-flags`` writes into a host file: the fields' new values, the renames, the diff, and the
    host as the edited file will load."""

    file: str
    fields: dict[str, str]
    renames: list[str]
    new_text: str
    diff: str
    host: Any

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "renames": self.renames, "fields": self.fields, "diff": self.diff}


def plan_flag_fix(host: Any, version: str | None) -> FlagFix | None:
    """The host-file edit that renames the flags SGLang ``version`` removed in ``server.command`` and
    ``server.ddtree_flags`` (None when there is nothing to rename); InputError when the file cannot be edited safely
    (hostfile.plan_server_edit)."""
    from .hostfile import plan_server_edit

    fields, renames = {}, []
    for key in FLAG_FIELDS:
        value = host.server.get(key)
        if not isinstance(value, str):
            continue
        fixed, done = renamed_in(value, version)
        if done:
            fields[key] = fixed
            renames += [r for r in done if r not in renames]
    if not fields:
        return None
    _, new, diff = plan_server_edit(host, fields)
    return FlagFix(host.source, fields, renames, new, diff,
                   dataclasses.replace(host, server={**host.server, **fields}))

# Runs on the host with the release first on sys.path; prints one MARK line.
_PARSE = r'''
import argparse, json, sys
argv = json.loads(sys.argv[1])
import sglang
from sglang.srt.server_args import ServerArgs
class Refused(Exception):
    pass
def error(message):
    raise Refused(message)
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
parser.error = error
out = {"version": getattr(sglang, "__version__", ""), "file": sglang.__file__}
try:
    _, out["unknown"] = parser.parse_known_args(argv)
except Refused as exc:
    out["error"] = str(exc)
print("%s" + json.dumps(out))
''' % MARK


def launch_argv(command: str) -> list[str] | None:
    """The arguments after SGLang's entry point in ``command``, or None when it does not call one."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for i, w in enumerate(words):
        if w in ("sglang.launch_server", "sglang.srt.entrypoints.launch_server") and i and words[i - 1] == "-m":
            return words[i + 1:]
        if w.rsplit("/", 1)[-1] == "sglang" and i + 1 < len(words) and words[i + 1] == "serve":
            return words[i + 2:]
    return None


def check_launch_line(conn: Any, host: Any, release_id: str | None, *, ddtree: bool = True,
                      timeout: float = 180.0) -> dict[str, Any]:
    """Parse the launch line with release ``release_id``'s ServerArgs on the host (None: the installed SGLang, with
    DDTree's flags left out when ``ddtree`` is False, as the baseline restart starts it); InputError (exit 2) on a
    flag or value it refuses. Returns what was checked (``checked`` False, with why, when there is nothing to
    parse)."""
    from .server import launch_command, server_env

    if not host.server.get("command"):
        return {"checked": False, "why": "no server.command (the systemd unit's own ExecStart is not read)"}
    command = launch_command(host, ddtree=ddtree)
    argv = launch_argv(command)
    if argv is None:
        return {"checked": False, "why": "server.command does not start sglang.launch_server / sglang serve"}
    env = server_env(host)  # the server's environment (remote/_frame.server_env), the release first on the path
    rest = env.pop("PYTHONPATH", "")
    if release_id is None:
        path = shlex.quote(rest) if rest else '"${PYTHONPATH:-}"'
    else:
        release = f"{host.release_root.rstrip('/')}/releases/{release_id}"
        path = shlex.quote(f"{release}:{rest}") if rest else shlex.quote(release) + '"${PYTHONPATH:+:$PYTHONPATH}"'
    which = "the installed sglang" if release_id is None else f"release {release_id}"
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    script = (f"env {assigns} PYTHONPATH={path} {shlex.quote(host.python)} -c {shlex.quote(_PARSE)} "
              f"{shlex.quote(json.dumps(argv))}")
    res = conn.run(script, timeout=timeout, check=False)
    line = next((ln for ln in res.stdout.decode(errors="replace").splitlines() if ln.startswith(MARK)), None)
    if line is None:
        tail = (res.stderr or res.stdout).decode(errors="replace").strip()[-800:]
        raise OperationFailed(f"host {host.name}: could not parse the launch line with {which}'s "
                              f"ServerArgs (exit {res.exit_code}): {tail}",
                              hint=f"{which} does not import sglang.srt.server_args; nothing was switched")
    got = json.loads(line[len(MARK):])
    flags = [a.split("=", 1)[0] for a in got.get("unknown", []) if a.startswith("-")]
    problems = [f"{f} (renamed {RENAMED[f][0]} in SGLang {RENAMED[f][1]})" if f in RENAMED else f for f in flags]
    stray = [a for a in got.get("unknown", []) if not a.startswith("-")]
    if problems or stray or got.get("error"):
        what = ("flags SGLang " + got["version"] + " does not know: " + ", ".join(problems)) if problems else ""
        if got.get("error"):
            what = "; ".join(x for x in (what, f"its parser refuses the line: {got['error']}") if x)
        if stray and not problems:
            what = "; ".join(x for x in (what, "arguments it does not take: " + " ".join(stray)) if x)
        renames = [f"{f} -> {RENAMED[f][0]}" for f in flags if f in RENAMED]
        unused = "nothing was restarted" if release_id is None else f"release {release_id} is not used"
        raise InputError(f"{host.source}: field 'server.command': {what}; the server would not start, so nothing "
                         f"was switched ({unused})",
                         hint=("rename " + ", ".join(renames) + " in the host file (`ddtree-deploy apply --fix-flags` "
                               "does it; with --dry-run it shows the edit)") if renames
                         else "fix the flag in the host file (or server.ddtree_flags) and apply again")
    return {"checked": True, "version": got["version"], "args": len(argv)}


def check_current_line(conn: Any, host: Any) -> dict[str, Any]:
    """The check against what a restart would run now: the active release with DDTree's flags, or the installed SGLang
    without them when no release is active (``hosts check`` and ``abi --live``); InputError as check_launch_line."""
    active = ReleaseState.read(conn, host).active
    return {**check_launch_line(conn, host, active, ddtree=active is not None), "release": active}
