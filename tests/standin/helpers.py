"""Helpers for deploy tests: a copy of a sandbox host with its own release root whose server is the stand-in,
overlays that script the stand-in's behaviour, and a cleanup that leaves the sandbox host as it was."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ddtree_deploy.inventory import Host
from ddtree_deploy.overlay import Overlay, OverlayFile
from ddtree_deploy.server import ServerControl
from ddtree_deploy.transport import HostConnection

STANDIN_SRC = Path(__file__).with_name("standin_server.py")
STANDIN_PATH = "/srv/ddtree-host/standin/standin_server.py"
RUNTIME_INIT = "sglang/srt/speculative/ddtree/__init__.py"


def standin_host(host: Host, root_name: str, *, probe: dict[str, Any] | None = None, **fields: Any) -> Host:
    """``host`` with release root ``/srv/ddtree-host/<root_name>`` and the stand-in as its managed server, on a
    server port of its own (copies of one sandbox host run side by side; the tool refuses a port another server
    holds)."""
    from ddtree_deploy.sandbox import _free_port

    server = dict(host.server, kind="managed",
                  command="{python} " + STANDIN_PATH + " --host {host} --port {port} {ddtree_flags}",
                  stop_timeout=5.0, port=_free_port(exclude={int(host.server.get("port", 0))}))
    probe_cfg = dict(host.probe, startup_timeout=4.0, generation_timeout=20.0, overlay_timeout=30.0)
    probe_cfg.update(probe or {})
    return dataclasses.replace(host, release_root=f"/srv/ddtree-host/{root_name}", server=server, probe=probe_cfg,
                               **fields)


def install_standin(host: Host) -> None:
    with HostConnection(host) as conn:
        conn.run(f"mkdir -p {Path(STANDIN_PATH).parent} && cat > {STANDIN_PATH}", stdin=STANDIN_SRC.read_bytes())


def remove_root(host: Host) -> None:
    """Stop the test's server and delete its release root (the installed package is untouched by design)."""
    with HostConnection(host) as conn:
        ServerControl(conn).stop()
        conn.run(f"rm -rf {host.release_root}")


def overlay(mode: str | None = None, *, version: str = "0.1.0-test", base_version: str = "0.5.11",
            extra: tuple[OverlayFile, ...] = ()) -> Overlay:
    """A small overlay: a DDTree package carrying ``__version__``, a patched ``sglang/version.py``, and (with
    ``mode``) the file that makes the stand-in crash / hang / answer wrongly when it runs from this release."""
    files = [
        OverlayFile(RUNTIME_INIT, f'__version__ = "{version}"\n'.encode(), action="add"),
        OverlayFile("sglang/version.py", f'__version__ = "{base_version}"\n# ddtree overlay {mode or "ok"}\n'.encode()),
    ]
    if mode:
        files.append(OverlayFile("sglang/standin_mode", mode.encode(), action="add"))
    return Overlay("sglang", "ddtree-test", version, base_version, "", tuple(files) + tuple(extra))


def write_host_yaml(host: Host, directory: Path) -> Path:
    """``host`` as a host file in ``directory`` (for driving the real command line against a host copy)."""
    import yaml

    from ddtree_deploy.inventory import HostFile

    # the host file's fields only (not where the file was read from: source, origin); tuples as YAML lists
    doc = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(host).items()
           if k in HostFile.model_fields and v is not None}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{host.name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_cli(inventory: Path, *args: str, timeout: float = 300, **env: str):
    """The real command line (``python -m ddtree_deploy``) against the host files in ``inventory``."""
    import os
    import subprocess
    import sys

    full = {**os.environ, "DDTREE_INVENTORY": str(inventory), "COLUMNS": "250", **env}
    return subprocess.run([sys.executable, "-m", "ddtree_deploy", *args], env=full, capture_output=True, text=True,
                          timeout=timeout, cwd=Path(__file__).resolve().parent.parent.parent)


FAKE_SYSTEMD_SRC = Path(__file__).with_name("fake_systemd.py")


def install_fake_systemd(host: Host, name: str) -> str:
    """The systemd stand-in (fake_systemd.py) on the host under /srv/ddtree-host/<name>: bin/{systemctl,journalctl,
    sudo}; unit drop-ins go to <dir>/units. Returns the directory."""
    d = f"/srv/ddtree-host/{name}"
    with HostConnection(host) as conn:
        conn.run(f"rm -rf {d} && mkdir -p {d}/bin {d}/units && cat > {d}/bin/fake_systemd.py", stdin=FAKE_SYSTEMD_SRC.read_bytes())
        conn.run(f"cd {d}/bin && sed -i '1i #!{host.python}' fake_systemd.py && chmod +x fake_systemd.py && "
                 f"for t in systemctl journalctl sudo; do ln -s fake_systemd.py $t; done && echo {d}/units > {d}/unit_dir")
    return d


def deployed_standin(base: Host, root_name: str, inventory: Path, *modes: str | None) -> tuple[Host, list[Any]]:
    """A stand-in host copy with its host file in ``inventory`` and one deploy per entry of ``modes`` (None: a good
    overlay; a mode: an overlay the stand-in fails with). Returns the host and the deploy reports."""
    from ddtree_deploy.deploy import deploy_overlay

    host = standin_host(base, root_name)
    install_standin(host)
    write_host_yaml(host, inventory)
    return host, [deploy_overlay(host, overlay(m)) for m in modes]
