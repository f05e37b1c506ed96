"""What a ``ddtree.deploy`` module runs from: a host's plan (the settings the CLI reads from the host file, resolved
here on the controller) and the overlay, as a bundle directory ``<dir>/<host>/{plan.json,overlay.tar}``.

The overlay is built off-host as ``apply`` builds it (``plan.plan``: snapshot, patch set, ABI check); the module
then runs the transaction on the host from the lock on (``deploy.deploy_overlay``'s steps).
"""

from __future__ import annotations

import getpass
import json
import socket
from pathlib import Path
from typing import Any, Callable

from ..hoststate import HostLayout
from ..errors import AbiIncompatible, InputError
from ..inventory import Host, probe_setting, server_setting
from ..overlay import Overlay
from ..probe import guard_spec, log_source, pid_source
from ..release import overlay_tar_chunks
from ..server import base_url, require_server, server_env, server_spec, server_kind
from ..decide import wanted_launch

PLAN, OVERLAY = "plan.json", "overlay.tar"
_PROBE_KEYS = ("overlay_timeout", "selftest_timeout", "startup_timeout", "startup_stall_timeout", "generation_timeout",
               "prompts", "max_new_tokens", "min_accept_length")


def host_plan(host: Host, overlay: Overlay | None = None, *, base_hashes: dict[str, str] | None = None,
              extra_meta: dict[str, Any] | None = None, allow_base_drift: bool = False, force: bool = False,
              record_baseline: bool = True, break_lock: bool = False) -> dict[str, Any]:
    """Everything the host side needs, from the host file (settings through server_setting / probe_setting, so the
    defaults are the schema's) and the overlay (its files and hashes; the bytes travel beside it)."""
    probe: dict[str, Any] = {k: probe_setting(host, k) for k in _PROBE_KEYS}
    probe.update(env=server_env(host), base_url=base_url(host), baseline_path=HostLayout.of(host).baseline,
                 health_url=base_url(host) + str(probe_setting(host, "health_path")))
    if server_kind(host) != "none":
        probe.update(pid_source=pid_source(host), log_source=log_source(host))
    plan: dict[str, Any] = {
        "host": host.name, "python": host.python, "site_packages": host.site_packages, "release_root": host.release_root,
        "keep_releases": host.keep_releases, "command_timeout": host.command_timeout, "probe": probe,
        "server_spec": server_spec(host) if server_kind(host) != "none" else {}, "guard": guard_spec(host),
        "wanted_launch": wanted_launch(host) if server_kind(host) != "none" else "", "force": force,
        "record_baseline": record_baseline, "break_lock": break_lock, "allow_base_drift": allow_base_drift,
        "base_hashes": base_hashes,
    }
    if overlay is not None:
        plan["overlay"] = {"package": overlay.package, "digest": overlay.digest, "patchset": overlay.patchset,
                           "patchset_version": overlay.patchset_version, "base_version": overlay.base_version,
                           "files": [{"path": f.path, "sha256": f.sha256, "mode": f.mode, "action": f.action}
                                     for f in overlay.files]}
        plan["meta"] = {"patchset": overlay.patchset, "patchset_version": overlay.patchset_version,
                        "base_version": overlay.base_version, "base_snapshot": overlay.base_snapshot,
                        "overlay_digest": overlay.digest, "overlay": overlay.manifest(), "notes": list(overlay.notes),
                        "pushed_by": f"{getpass.getuser()}@{socket.gethostname()} (ansible)",
                        "allow_base_drift": allow_base_drift, **(extra_meta or {})}
    return plan


def write_bundle(directory: Path, host: Host, overlay: Overlay | None, **plan_args: Any) -> Path:
    """``directory/<host>/plan.json`` (and ``overlay.tar`` with an overlay): the bundle the modules read."""
    out = directory / host.name
    out.mkdir(parents=True, exist_ok=True)
    (out / PLAN).write_text(json.dumps(host_plan(host, overlay, **plan_args), indent=1, sort_keys=True))
    if overlay is not None:
        (out / OVERLAY).write_bytes(b"".join(overlay_tar_chunks(overlay)))
    return out


def read_bundle(path: Path) -> tuple[dict[str, Any], bytes]:
    plan = json.loads((path / PLAN).read_text())
    tar = path / OVERLAY
    return plan, tar.read_bytes() if tar.is_file() else b""


def prepare(host: Host, directory: Path, *, patchset: str | None = None, ignore_abi: bool = False,
            dry_run: bool = False, allow_base_drift: bool = False, force: bool = False, record_baseline: bool = True,
            break_lock: bool = False, progress: Callable[[str], None] = lambda m: None) -> Path:
    """The overlay for ``host`` built as ``apply`` builds it (snapshot, patch set, ABI), written as its bundle.
    Refusals (ABI, patch, unreachable) raise as they do for ``apply``."""
    from ..plan import plan

    require_server(host)
    p = plan(host, patchset=patchset, progress=progress, dry_run=dry_run, allow_base_drift=allow_base_drift)
    if p.overlay is None:  # a dry run takes no snapshot
        raise InputError(f"host {host.name}: no snapshot yet, so no overlay to check against the host",
                         hint=f"take one first: `ddtree-deploy snapshot take {host.name}`")
    if p.abi_errors and not ignore_abi:
        errors = [f"{d.get('rule')}: {d.get('what')} (fix: {d.get('fix')})" for d in p.abi_dicts() if d.get("severity") == "error"]
        raise AbiIncompatible(f"host {host.name}: ABI check failed; nothing was pushed\n  " + "\n  ".join(errors),
                              hint="fix the host or rebuild for it; --ignore-abi pushes anyway (dangerous)")
    return write_bundle(directory, host, p.overlay, base_hashes=p.base_hashes, allow_base_drift=allow_base_drift,
                        force=force, record_baseline=record_baseline, break_lock=break_lock,
                        extra_meta={"abi_ignored": bool(p.abi_errors and ignore_abi), "snapshot": p.snapshot_id})


__all__ = ["OVERLAY", "PLAN", "host_plan", "prepare", "read_bundle", "server_setting", "write_bundle"]
