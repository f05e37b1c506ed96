"""Local sandbox hosts that behave like remote ones: one sshd per host on loopback, each in its own mount namespace.

Every host sees its own private tree at ``/srv/ddtree-host`` (a bind mount that exists only inside the host's
namespace), holding a Python environment with a real SGLang wheel installed without dependencies, and a release
root. Paths are therefore identical across hosts while contents differ, exactly like two real eval boxes. The
sandbox writes a host YAML per host into the inventory so every command works on it unchanged.

Needs root (for ``unshare --mount``) and ``/usr/sbin/sshd``; tells you how to get them when missing.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import tenacity
import yaml

from .. import paths
from ..errors import OperationFailed
from ..wheels import fetch_wheel

MOUNT_POINT = "/srv/ddtree-host"
SSHD = "/usr/sbin/sshd"
PY_TAG = f"python{sys.version_info.major}.{sys.version_info.minor}"

#: The default sandbox: the DDTree patch set's base and a drifted release, so version drift is always exercised.
DEFAULT_HOSTS: tuple[tuple[str, str], ...] = (("sandbox-base", "0.5.11"), ("sandbox-drift", "0.5.23"))


@dataclass
class SandboxHost:
    """What the sandbox made for one host; recorded in ``state.json``."""

    name: str
    sglang: str
    ssh_port: int
    server_port: int
    host_dir: str
    inventory_file: str
    pid: int | None = None

    @property
    def fs(self) -> Path:
        return Path(self.host_dir) / "fs"


@dataclass
class SandboxState:
    root: str
    hosts: dict[str, SandboxHost] = field(default_factory=dict)


def default_root() -> Path:
    """``$DDTREE_SANDBOX_DIR``, else the checkout's ``.sandbox/``, else the user state dir (ddtree_deploy.paths)."""
    return paths.sandbox_dir()


class Sandbox:
    """Create, inspect and remove the local sandbox hosts rooted at ``root``."""

    def __init__(self, root: Path | None = None, inventory: Path | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.root = (root or default_root()).absolute()
        self.inventory = (inventory or paths.inventory_dir()).absolute()
        self.log = log or (lambda msg: None)

    # -- state -----------------------------------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def client_dir(self) -> Path:
        return self.root / "client"

    def load_state(self) -> SandboxState:
        if not self.state_file.exists():
            return SandboxState(root=str(self.root))
        raw = json.loads(self.state_file.read_text())
        return SandboxState(root=raw["root"], hosts={k: SandboxHost(**v) for k, v in raw["hosts"].items()})

    def save_state(self, state: SandboxState) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"root": state.root, "hosts": {k: asdict(v) for k, v in state.hosts.items()}}, indent=1))
        tmp.replace(self.state_file)

    # -- up ------------------------------------------------------------------------------------------------------------
    def up(self, hosts: tuple[tuple[str, str], ...] = DEFAULT_HOSTS) -> SandboxState:
        """Make (or resume) every host; safe to run again: what exists and runs is left as it is."""
        _check_prerequisites()
        state = self.load_state()
        self._client_keys()
        Path(MOUNT_POINT).mkdir(parents=True, exist_ok=True)
        for name, version in hosts:
            host = state.hosts.get(name)
            if host is None or host.sglang != version:
                ssh_port = _free_port(exclude={h.ssh_port for h in state.hosts.values()} | {h.server_port for h in state.hosts.values()})
                server_port = _free_port(exclude={ssh_port} | {h.ssh_port for h in state.hosts.values()} | {h.server_port for h in state.hosts.values()})
                host = SandboxHost(name=name, sglang=version, ssh_port=ssh_port, server_port=server_port,
                                   host_dir=str(self.root / "hosts" / name), inventory_file=str(self.inventory / f"{name}.yaml"))
                state.hosts[name] = host
            self._provision(host)
            self._start_sshd(host)
            self._write_inventory(host)
            self.save_state(state)
        return state

    def _client_keys(self) -> None:
        self.client_dir.mkdir(parents=True, exist_ok=True)
        key = self.client_dir / "id_ed25519"
        if not key.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ddtree-sandbox-client", "-f", str(key)])
        (self.client_dir / "authorized_keys").write_text((self.client_dir / "id_ed25519.pub").read_text())
        (self.client_dir / "known_hosts").touch()

    def _in_namespace(self, host: SandboxHost, command: str) -> list[str]:
        """Argv that runs ``command`` with the host's private tree mounted at MOUNT_POINT."""
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f"mount --bind {host.fs} {MOUNT_POINT} && {command}"]

    def _provision(self, host: SandboxHost) -> None:
        hdir = Path(host.host_dir)
        (hdir).mkdir(parents=True, exist_ok=True)
        host.fs.mkdir(exist_ok=True)
        hostkey = hdir / "ssh_host_ed25519_key"
        if not hostkey.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{host.name}-hostkey", "-f", str(hostkey)])
        marker = host.fs / ".sglang-installed"
        if marker.exists() and marker.read_text().strip() == host.sglang:
            return
        self.log(f"{host.name}: installing sglang=={host.sglang} (no deps) into its Python environment")
        shutil.rmtree(host.fs / "venv", ignore_errors=True)
        _run(self._in_namespace(host, python_env_command(f"{MOUNT_POINT}/venv", fetch_wheel("sglang", host.sglang))))
        copy_refengine(host.fs / "venv" / "lib" / PY_TAG / "site-packages")
        (host.fs / "ddtree").mkdir(exist_ok=True)
        marker.write_text(host.sglang)

    def _start_sshd(self, host: SandboxHost) -> None:
        if host.pid and _alive(host.pid) and _port_speaks_ssh(host.ssh_port):
            return
        hdir = Path(host.host_dir)
        config = hdir / "sshd_config"
        config.write_text("\n".join([
            f"Port {host.ssh_port}", "ListenAddress 127.0.0.1",
            f"HostKey {hdir / 'ssh_host_ed25519_key'}", f"PidFile {hdir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.client_dir / 'authorized_keys'}",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "UsePAM no", "StrictModes no", "PrintMotd no", "MaxStartups 200", "MaxSessions 200",
            "LogLevel ERROR", "Subsystem sftp internal-sftp",
            # bash sources ~/.bashrc for SSH commands only at shell level 1; this machine's root .bashrc runs
            # `pyenv init` (~0.1 s of CPU per command), which a host's non-interactive commands should not pay
            "SetEnv SHLVL=1", "",
        ]))
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        log = open(hdir / "sshd.log", "ab")
        proc = subprocess.Popen(self._in_namespace(host, f"exec {SSHD} -D -e -f {config}"), stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        host.pid = proc.pid

        @tenacity.retry(stop=tenacity.stop_after_delay(15), wait=tenacity.wait_fixed(0.05), reraise=True,
                        retry=tenacity.retry_if_result(lambda up: not up))
        def answers() -> bool:
            if proc.poll() is not None:
                raise OperationFailed(f"sandbox host {host.name}: sshd exited with {proc.returncode}; see {hdir / 'sshd.log'}")
            return _port_speaks_ssh(host.ssh_port)

        try:
            answers()
        except tenacity.RetryError:
            raise OperationFailed(f"sandbox host {host.name}: sshd did not answer on port {host.ssh_port} within 15 s") from None
        pub = (hdir / "ssh_host_ed25519_key.pub").read_text().split()
        known = self.client_dir / "known_hosts"
        entry = f"[127.0.0.1]:{host.ssh_port}"
        lines = [ln for ln in known.read_text().splitlines() if ln and not ln.startswith(entry + " ")]
        lines.append(f"{entry} {pub[0]} {pub[1]}")
        known.write_text("\n".join(lines) + "\n")

    def _write_inventory(self, host: SandboxHost) -> None:
        self.inventory.mkdir(parents=True, exist_ok=True)
        doc = host_document(host.name, host.sglang, host.server_port, f"{MOUNT_POINT}/venv", f"{MOUNT_POINT}/ddtree", {
            "address": "127.0.0.1",
            "port": host.ssh_port,
            "user": "root",
            "identity_file": str(self.client_dir / "id_ed25519"),
            "known_hosts": str(self.client_dir / "known_hosts"),
            "connect_timeout": 5.0,
        })
        doc["description"] += ", made by `ddtree-deploy sandbox up`"
        Path(host.inventory_file).write_text(
            "# Written by `ddtree-deploy sandbox up`; removed by `sandbox down`.\n" + yaml.safe_dump(doc, sort_keys=False))

    # -- status / down -------------------------------------------------------------------------------------------------
    def status(self) -> list[dict[str, object]]:
        state = self.load_state()
        rows = []
        for host in state.hosts.values():
            rows.append({
                "name": host.name, "sglang": host.sglang, "ssh_port": host.ssh_port, "server_port": host.server_port,
                "sshd_pid": host.pid, "running": bool(host.pid and _alive(host.pid) and _port_speaks_ssh(host.ssh_port)),
                "inventory_file": host.inventory_file,
            })
        return rows

    def down(self) -> list[str]:
        """Stop every process of every sandbox host, remove its files and the host YAMLs it wrote."""
        state = self.load_state()
        removed = []
        for host in state.hosts.values():
            if host.pid and _alive(host.pid):
                _kill_namespace(host.pid)
            Path(host.inventory_file).unlink(missing_ok=True)
            removed.append(host.name)
        shutil.rmtree(self.root, ignore_errors=True)
        return removed


# -- helpers ---------------------------------------------------------------------------------------------------------
def creator_site_dirs() -> list[str]:
    """The site-packages of the interpreter running this, when it is a venv (``make`` runs everything in
    ``.venv/``): ``--system-site-packages`` exposes only the base interpreter's, which lacks torch."""
    if sys.prefix == sys.base_prefix:
        return []
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(p for p in (paths["purelib"], paths["platlib"]) if os.path.isdir(p)))


def python_env_command(venv: str, wheel: Path) -> str:
    """Shell command that makes a Python environment at ``venv`` (this interpreter, its site-packages visible for
    torch: the base interpreter's through ``--system-site-packages``, a creating venv's through a ``.pth`` file) with
    ``wheel`` installed into it without dependencies."""
    site = f"{venv}/lib/{PY_TAG}/site-packages"
    command = (f"{sys.executable} -m venv --without-pip --system-site-packages {venv} && "
               f"{sys.executable} -m pip install --quiet --no-deps --no-compile --disable-pip-version-check "
               f"--no-warn-script-location --target {site} {wheel}")
    for n, parent in enumerate(creator_site_dirs()):
        line = shlex.quote(f"import site; site.addsitedir({parent!r})")
        command += f" && echo {line} > {shlex.quote(f'{site}/_ddtree_creator_{n}.pth')}"
    return command


def copy_refengine(site_packages: Path) -> None:
    """The GPU-less reference engine, importable as ``ddtree_refengine`` (what the hosts' servers run)."""
    refengine = Path(__file__).parent / "refengine"
    if refengine.is_dir():
        shutil.copytree(refengine, site_packages / "ddtree_refengine", ignore=shutil.ignore_patterns("__pycache__"),
                        dirs_exist_ok=True)


def host_document(name: str, sglang: str, server_port: int, venv: str, release_root: str,
                  reach: dict[str, object]) -> dict[str, object]:
    """A sandbox host file: how to reach the host (``reach``), its Python, and the reference engine as its server."""
    return {
        "name": name,
        "description": f"local sandbox host (sglang {sglang})",
        **reach,
        "command_timeout": 300.0,
        "python": f"{venv}/bin/python",
        "site_packages": f"{venv}/lib/{PY_TAG}/site-packages",
        "release_root": release_root,
        "sandbox": True,
        "server": {
            "kind": "managed",
            "command": "{python} -m ddtree_refengine --host {host} --port {port} {ddtree_flags}",
            "ddtree_flags": "--speculative-algorithm DDTREE --ddtree-budget 16",
            "host": "127.0.0.1",
            "port": server_port,
            "stop_timeout": 10.0,
        },
        "probe": {"startup_timeout": 120.0, "generation_timeout": 60.0,
                  "prompts": ["the quick brown fox", "hello world", "speculative decoding"], "max_new_tokens": 24},
    }


def make_local_host(directory: Path, inventory: Path, name: str = "local", sglang: str = DEFAULT_HOSTS[0][1]) -> Path:
    """A ``connection: local`` host on this machine: a Python environment with a real SGLang release under
    ``directory``, a release root beside it, and its host file in ``inventory`` (returned). No root, no sshd.

    What ``connection: local`` is for is the GPU box itself; this makes one anywhere, for trying and testing it.
    """
    directory = directory.absolute()
    venv = directory / "venv"
    if not (venv / "bin" / "python").exists():
        shutil.rmtree(venv, ignore_errors=True)
        _run(["sh", "-c", python_env_command(str(venv), fetch_wheel("sglang", sglang))])
        copy_refengine(venv / "lib" / PY_TAG / "site-packages")
    (directory / "ddtree").mkdir(exist_ok=True)
    doc = host_document(name, sglang, _free_port(exclude=set()), str(venv), str(directory / "ddtree"),
                        {"connection": "local"})
    inventory.mkdir(parents=True, exist_ok=True)
    path = inventory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _check_prerequisites() -> None:
    if os.geteuid() != 0:
        raise OperationFailed("the sandbox needs root (it gives each host its own mount namespace with unshare)")
    if not Path(SSHD).exists():
        raise OperationFailed(f"{SSHD} not found", hint="apt-get install openssh-server")
    if not shutil.which("unshare"):
        raise OperationFailed("unshare not found", hint="apt-get install util-linux")


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise OperationFailed(f"sandbox: {' '.join(argv[:6])}... failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")


def _free_port(exclude: set[int]) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in exclude:
            return port


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _port_speaks_ssh(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.settimeout(0.5)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _kill_namespace(pid: int) -> None:
    """Kill every process sharing ``pid``'s mount namespace (servers started over SSH included), then ``pid``."""
    try:
        ns = os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        ns = None
    members = []
    if ns:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if os.readlink(entry / "ns" / "mnt") == ns:
                        members.append(int(entry.name))
                except OSError:
                    continue
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for member in members + [pid]:
            try:
                os.kill(member, sig)
            except OSError:
                pass
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and any(_alive(m) for m in members + [pid]):
            time.sleep(0.05)
