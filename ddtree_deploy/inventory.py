"""Host inventory: one YAML file per host, validated into a frozen ``Host``.

Everything later in the flow (transport, snapshot, release, server, probe) reads hosts from here and nowhere
else, so a typo is caught once, with the file and field named, before any host is touched. A bad file takes only
its own host out: the other hosts stay usable, the bad one is reported loudly (a warning naming the file and
field on every load), and a command that names it fails with exit 2. Every problem of a file is listed at once.

Where the inventory is: ``--inventory`` or ``$DDTREE_INVENTORY`` (that directory alone); else, in a checkout, its
``hosts/`` and the user inventory ``~/.config/ddtree-deploy/hosts`` both; installed, the user inventory
(ddtree_deploy.paths.inventory_dirs). A host name defined in two files, in one directory or across the two, makes
the host unusable with an error naming both files: which one was meant cannot be known. Each host remembers the
inventory it came from (``hosts list`` shows it). Documented examples live in ``hosts/examples/``, which is
never loaded by default.

Groups, as in Ansible: a host file's ``groups: [gpu, eu]``, and/or a ``groups.yaml`` in an inventory directory
(``gpu: [gpu1, gpu2]``). Commands choose hosts by pattern (``select``): names, groups, globs over both
(``'gpu*'``), ``all``, comma-separated (``-H a,b``), ``!x`` to leave one out, narrowed by ``--limit``.
"""

from __future__ import annotations

import difflib
import fnmatch
import logging
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Optional

import yaml

from . import paths
from .errors import InputError
from .schema import (MAX_SECONDS, StrMap, Strict, absolute_path, become_command, checked, collect, load_yaml, port_range,
                     positive, raise_problems, seconds, setting)
from .transport.registry import TRANSPORTS

log = logging.getLogger("ddtree_deploy.inventory")

#: A host name is used as a directory name (snapshots) and in file names: a plain identifier, no path parts.
HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: Fields that only mean something for SSH; a ``connection: local`` host must not set them.
SSH_ONLY = ("address", "ssh_alias", "ssh_config", "user", "port", "identity_file", "trust_on_first_use", "ssh_agent")


def host_name(value: str) -> str | None:
    if HOST_NAME.match(value) and ".." not in value:
        return None
    return "expected a plain host name (letters, digits, '.', '_', '-'; starting with a letter or digit; no '/' or '..')"


Port = checked(int, port_range, json={"minimum": 1, "maximum": 65535})
AbsolutePath = checked(str, absolute_path, json={"pattern": "^/"})
Seconds = checked(float, seconds(), json={"exclusiveMinimum": 0, "maximum": MAX_SECONDS})
SecondsOrOff = checked(float, seconds(zero_ok=True), json={"minimum": 0, "maximum": MAX_SECONDS})
Positive = checked(int, positive, json={"minimum": 1})


class ServerSection(Strict):
    """How SGLang (or the sandbox's reference engine) runs on the host. Documented in hosts/examples/ct129.yaml."""

    kind: Literal["none", "managed", "systemd"] = setting(
        "none", help="how the server runs: a managed process, a systemd unit, or none")
    command: str = setting("", help="launch command template; {python}, {port}, {host}, {release_root}, {ddtree_flags}")
    ddtree_flags: str = setting("", help="flags that turn DDTree on, substituted for {ddtree_flags}")
    host: str = setting("127.0.0.1", help="address the server listens on, as seen from the host")
    port: Port = setting(30000)
    env: StrMap = setting(factory=dict, help="extra environment for the server")
    unit: str = setting("", help="systemd unit name (kind: systemd)")
    unit_dir: AbsolutePath = setting("/etc/systemd/system", help="where the unit's drop-in directory lives (kind: systemd)")
    become: checked(str, become_command) = setting(
        "", help="privilege escalation for the drop-in, systemctl and journalctl: sudo or doas (run with -n), or an "
                 "absolute command prefix")
    stop_timeout: Seconds = setting(20.0)


class ProbeSection(Strict):
    """How the probe judges a freshly started server."""

    startup_timeout: Seconds = setting(600.0, help="seconds for /health to answer 200")
    startup_stall_timeout: SecondsOrOff = setting(
        300.0, help="fail start-up once the server log is silent and /health failing this long (0: off)")
    overlay_timeout: Seconds = setting(60.0)
    selftest_timeout: Seconds = setting(120.0)
    generation_timeout: Seconds = setting(120.0)
    health_path: str = setting("/health")
    prompts: list[str] = setting(factory=list)
    max_new_tokens: Positive = setting(32)
    min_accept_length: float = setting(0.0)


def known_connection(value: str) -> str | None:
    """A ``connection`` the transport registry has, read when the file is (so a kind registered at any time counts)."""
    return None if value in TRANSPORTS else "expected one of " + ", ".join(repr(k) for k in TRANSPORTS)


class HostFile(Strict):
    """A host file (``hosts/<name>.yaml``): how to reach the host and where SGLang lives on it."""

    name: Optional[checked(str, host_name, json={"pattern": HOST_NAME.pattern})] = setting(None, help="host name; defaults to the file name")
    connection: checked(str, known_connection, "a registered transport") = setting(
        "ssh", help="how the host is reached, a registered transport: ssh (default), or local: this machine, commands "
        "run as local subprocesses")
    description: str = setting("")
    address: Optional[str] = setting(None, help="DNS name or IP; or give ssh_alias")
    ssh_alias: Optional[str] = setting(
        None, help="a Host entry of the ssh_config file (honours HostName, Port, User, ProxyJump)")
    ssh_config: Optional[str] = setting(None, help="ssh_config file to read instead of ~/.ssh/config")
    user: Optional[str] = setting(None)
    port: Optional[Port] = setting(None)
    identity_file: Optional[str] = setting(None)
    known_hosts: str = setting("~/.ssh/known_hosts", help="known_hosts file checked strictly")
    trust_on_first_use: bool = setting(False, help="accept and record an unknown key once (never a changed one)")
    ssh_agent: bool = setting(True, help="offer the keys held in ssh-agent, as OpenSSH does (false: never)")
    connect_timeout: Seconds = setting(10.0)
    command_timeout: Seconds = setting(600.0)
    python: AbsolutePath = setting(help="the interpreter SGLang runs under")
    site_packages: AbsolutePath = setting(help="site-packages holding the installed sglang")
    release_root: AbsolutePath = setting(help="where overlay releases live")
    keep_releases: Positive = setting(5)
    groups: list[checked(str, host_name, json={"pattern": HOST_NAME.pattern})] = setting(
        factory=list, help="groups this host belongs to (select them with -H GROUP, like Ansible's)")
    sandbox: bool = setting(False, help="written by `ddtree-deploy sandbox up`")
    server: ServerSection = setting(factory=ServerSection)
    probe: ProbeSection = setting(factory=ProbeSection)


def host_file_schema() -> dict[str, Any]:
    """The JSON Schema of a host file, for editor completion (``ddtree-deploy hosts schema``; hosts/host.schema.json).

    ``connection`` is a string there, its registered kinds given as ``examples`` (what editors offer as values), not
    an ``enum``: the registry decides at load (``known_connection``), so a new transport needs no new schema for its
    host files to be accepted (tests/cli/test_cli_yaml_inputs.py allows the committed examples to lag the registry,
    and nothing else)."""
    schema = HostFile.model_json_schema()
    schema["properties"]["connection"]["examples"] = list(TRANSPORTS)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ddtree-deploy host file"
    return schema


@dataclass(frozen=True)
class Host:
    """A validated host: how to reach it and where SGLang lives on it."""

    name: str
    source: str
    python: str
    site_packages: str
    release_root: str
    address: str | None = None
    ssh_alias: str | None = None
    ssh_config: str | None = None
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    trust_on_first_use: bool = False
    ssh_agent: bool = True
    connection: str = "ssh"
    connect_timeout: float = 10.0
    command_timeout: float = 600.0
    keep_releases: int = 5
    description: str = ""
    groups: tuple[str, ...] = ()
    sandbox: bool = False
    server: dict[str, Any] = field(default_factory=dict)
    probe: dict[str, Any] = field(default_factory=dict)
    origin: str = ""  # the inventory the file was read from: checkout, user, $DDTREE_INVENTORY, --inventory

    @property
    def target(self) -> str:
        """What we hand to ssh: the alias when there is one, else the address ("local" for a local host)."""
        if self.connection == "local":
            return "local"
        return self.ssh_alias or self.address or self.name

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target": self.target,
            "user": self.user,
            "port": self.port,
            "python": self.python,
            "site_packages": self.site_packages,
            "release_root": self.release_root,
            "server": server_setting(self, "kind"),
            "groups": list(self.groups),
            "inventory": self.origin,
            "file": self.source,
        }


def _setting(values: dict[str, Any], section: type[Strict], key: str) -> Any:
    if key in values:
        return values[key]
    return section.model_fields[key].get_default(call_default_factory=True)


def server_setting(host: Host, key: str) -> Any:
    """``host.server[key]``, or the default ``ServerSection`` declares for it when the Host was built without it (a
    loaded host file has every key): the one place a server setting's default is written."""
    return _setting(host.server, ServerSection, key)


def probe_setting(host: Host, key: str) -> Any:
    """``host.probe[key]``, or ``ProbeSection``'s default for it (see :func:`server_setting`)."""
    return _setting(host.probe, ProbeSection, key)


def _read_text(path: Path, source: str) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{source}: cannot read host file: {exc.strerror}") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{source}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}, line {line})",
                         hint="save the host file as UTF-8") from exc


def load_host_file(path: Path, origin: str = "file") -> Host:
    """Parse and validate one host file; every problem is reported at once, each naming ``path`` and the field."""
    source = str(path)
    text = _read_text(path, source)
    try:
        doc = load_yaml(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from exc
    if doc is None:
        raise InputError(f"{source}: empty host file (expected a mapping with python, site_packages, release_root)")
    data, problems = collect(HostFile, doc)
    if isinstance(doc, dict):
        problems += _cross_field_problems(doc, data, path)
    raise_problems(source, problems)
    name = data.pop("name") or path.stem
    data["groups"] = tuple(data.get("groups") or ())
    return Host(name=name, source=source, origin=origin, **data)


def _cross_field_problems(doc: dict[str, Any], data: dict[str, Any], path: Path) -> list[str]:
    """What one field alone cannot say: how the host is reached, and where releases may live."""
    problems = []
    if "name" not in doc and host_name(path.stem):
        problems.append(f"file name {path.name!r} is not a plain host name: rename it or set field 'name'")
    if data.get("connection") == "local":
        given = [f for f in SSH_ONLY if doc.get(f) is not None]
        problems += [f"field '{f}': not used with connection: local (the host is this machine)" for f in given]
    elif "connection" in data and not doc.get("address") and not doc.get("ssh_alias"):
        problems.append("missing required field 'address': expected a string (or give 'ssh_alias', or "
                        "'connection: local' for this machine)")
    root, site = data.get("release_root"), data.get("site_packages")
    if root and site:
        problems += release_root_problems(root, site)
    return problems


def release_root_problems(release_root: str, site_packages: str, package: str | None = None) -> list[str]:
    """``release_root`` must lie outside site-packages and the installed package (``package``, by default
    ``<site_packages>/sglang``): releases are written there, and the installed package is never to be touched.

    Compares the paths as given (normalised as text): the host file's check. ``hostpaths`` calls it again with the
    paths as the host resolves them, which is what a write follows."""
    root, site = posixpath.normpath(release_root), posixpath.normpath(site_packages)
    package = posixpath.normpath(package) if package else posixpath.join(site, "sglang")
    if root == "/":
        return ["field 'release_root': expected a directory of its own, got '/'"]
    for inside, what in ((package, "the installed package"), (site, "site-packages")):
        if root == inside or root.startswith(inside.rstrip("/") + "/"):
            return [f"field 'release_root': must be outside {what} ({inside}), got {release_root!r}"]
    return []


GROUPS_FILE = "groups.yaml"  # an inventory directory's groups (group -> host names); never a host file
_GLOB = re.compile(r"[*?\[]")


@dataclass
class Inventory:
    """The hosts of the inventory directories: the good ones by name, each bad file with why it is bad, and the
    groups (from the host files' ``groups`` and the directories' groups.yaml)."""

    directories: list[tuple[Path, str]]  # (directory, where it comes from), in the order read
    hosts: dict[str, Host] = field(default_factory=dict)
    broken: dict[str, InputError] = field(default_factory=dict)  # host name (or file stem) -> its error
    broken_files: dict[str, str] = field(default_factory=dict)  # host name (or file stem) -> file
    groups: dict[str, list[str]] = field(default_factory=dict)  # group -> member host names, in file order
    group_files: dict[str, str] = field(default_factory=dict)  # group -> the groups.yaml that lists it (if one)
    shadowed: list[tuple[Path, str]] = field(default_factory=list)  # default inventories not read (explicit one set)

    @property
    def directory(self) -> Path:
        return self.directories[0][0]

    def describe(self) -> str:
        return " + ".join(str(d) for d, _ in self.directories)

    def warn(self, skip: Iterable[str] = ()) -> None:
        """One warning per bad file: it names the file and field, and says the host is left out (``skip``: hosts
        the command names, whose error is raised instead)."""
        done = {self.broken_files.get(n) for n in skip}
        for name, error in self.broken.items():
            if self.broken_files[name] in done:
                continue
            done.add(self.broken_files[name])
            log.warning("%s; host %r is left out until its file is fixed", error.message.replace("\n", "\n    "), name)

    def get(self, name: str) -> Host:
        """A host by name, or by the path of its YAML file; a host whose file is bad is an error (exit 2)."""
        path = host_file_path(name)
        if path is not None:
            return load_host_file(path)
        if name in self.hosts:
            return self.hosts[name]
        if name in self.broken:
            error = self.broken[name]
            raise InputError(f"host {name!r} cannot be used: {error.message}", hint=error.hint) from error
        raise self._unknown(name)

    def _unknown(self, name: str, what: str = "host") -> InputError:
        known = ", ".join(sorted(self.hosts)) or "none"
        bad = f"; unusable: {', '.join(sorted(self.broken))}" if self.broken else ""
        groups = f"; groups: {', '.join(sorted(self.groups))}" if self.groups else ""
        close = difflib.get_close_matches(name, [*self.hosts, *self.broken, *self.groups], n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        hint += "`ddtree-deploy hosts list` shows the inventory; README: 'Writing a host file'"
        for directory, origin in self.shadowed:  # the file is there, in an inventory this run does not read
            for path in (directory / f"{name}.yaml", directory / f"{name}.yml"):
                if path.is_file():
                    hint = (f"{path} defines it, but the {origin} inventory is not read while "
                            f"{self.directories[0][1]} is set: move the file to {self.directory / path.name}")
        return InputError(f"unknown {what} {name!r} (inventory {self.describe()} has: {known}{bad}{groups})", hint=hint)

    # -- choosing hosts by pattern ---------------------------------------------------------------------------------
    def select(self, patterns: Iterable[str], limit: Iterable[str] = ()) -> tuple[list[Host], dict[str, str]]:
        """The hosts the patterns name, in order, each once; narrowed to those ``limit`` also names (when given).

        A term is a host name, a host file path, a group, ``all``, or a glob over host and group names
        (``gpu*``); ``!term`` leaves hosts out. Returns the hosts and the unusable ones a group, glob or ``all``
        took in (name -> why: reported, not worked on); a host named outright whose file is bad raises (exit 2),
        and so does a term that matches nothing.
        """
        chosen, unusable = self._match(list(patterns))
        limit = list(limit)
        if limit:
            allowed, allowed_unusable = self._match(limit)
            names = {h.name for h in allowed} | set(allowed_unusable)
            chosen = [h for h in chosen if h.name in names]
            unusable = {n: why for n, why in unusable.items() if n in names}
            if not chosen and not unusable:
                raise InputError(f"--limit {','.join(limit)} leaves none of the selected hosts",
                                 hint="`ddtree-deploy hosts list` shows the hosts and their groups")
        return chosen, unusable

    def _match(self, terms: list[str]) -> tuple[list[Host], dict[str, str]]:
        chosen: dict[str, Host] = {}
        unusable: dict[str, str] = {}
        excluded: set[str] = set()
        for term in terms:
            if term.startswith("!"):
                excluded.update(self._names(term[1:]))
                continue
            for name in self._names(term):
                if name in self.broken and not (term == name or host_file_path(term)):
                    unusable[name] = self.broken[name].message
                elif host_file_path(term):
                    host = load_host_file(Path(term))
                    chosen.setdefault(host.name, host)
                else:
                    chosen.setdefault(name, self.get(name))
        return ([h for n, h in chosen.items() if n not in excluded],
                {n: why for n, why in unusable.items() if n not in excluded})

    def _names(self, term: str) -> list[str]:
        """The host names one term stands for (unusable hosts included; ``get`` raises for them later)."""
        if host_file_path(term):
            return [term]
        if term == "all":
            return [*self.hosts, *(n for n in self.broken if n not in self.hosts)]
        if _GLOB.search(term):
            names = [n for n in [*self.hosts, *self.broken] if fnmatch.fnmatchcase(n, term)]
            for group in (g for g in self.groups if fnmatch.fnmatchcase(g, term)):
                names += self._members(group)
            if not names:
                raise self._unknown(term, "host pattern")
            return list(dict.fromkeys(names))
        if term in self.groups and term not in self.hosts and term not in self.broken:
            return self._members(term)
        return [term]

    def _members(self, group: str) -> list[str]:
        for name in self.groups[group]:
            if name not in self.hosts and name not in self.broken:
                raise InputError(f"{self.group_files.get(group, 'groups')}: group {group!r} lists unknown host {name!r}",
                                 hint=f"add a host file for {name!r} or remove it from the group")
        return self.groups[group]


def host_file_path(name: str) -> Path | None:
    """``name`` as the path of a host file, when it is one (``hosts/gpu1.yaml``), else None."""
    path = Path(name)
    return path if path.suffix in (".yaml", ".yml") and path.is_file() else None


def _names_in(path: Path) -> list[str]:
    """The host names a (possibly broken) file claims: its 'name' field if readable, and its file stem."""
    names = [path.stem]
    try:
        doc = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except Exception:
        return names
    if isinstance(doc, dict) and isinstance(doc.get("name"), str) and doc["name"] not in names:
        names.insert(0, doc["name"])
    return names


def _inventory_dirs(directory: Path | None) -> tuple[list[tuple[Path, str]], list[tuple[Path, str]], bool]:
    """The directories to read, the default ones an explicit choice leaves unread, and whether it was explicit."""
    defaults = [(paths.checkout_root() / "hosts", "checkout")] if paths.checkout_root() else []
    defaults.append((paths.user_inventory_dir(), "user"))
    if directory is not None:
        chosen = [(directory, "--inventory")]
    else:
        chosen = paths.inventory_dirs()
    explicit = directory is not None or paths.inventory_is_explicit()
    chosen_paths = {d.absolute() for d, _ in chosen}
    shadowed = [(d, o) for d, o in defaults if explicit and d.absolute() not in chosen_paths]
    return chosen, shadowed, explicit


def _read_groups(path: Path, inventory: Inventory) -> None:
    """A groups.yaml: ``group: [host, ...]``; a bad one is an error naming the file (it concerns many hosts)."""
    try:
        doc = yaml.safe_load(_read_text(path, str(path)))
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from exc
    if doc is None:
        return
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a mapping of group name to a list of host names, got {type(doc).__name__}")
    for group, members in doc.items():
        if not isinstance(group, str) or host_name(group):
            raise InputError(f"{path}: group {group!r}: {host_name(str(group)) or 'expected a string'}")
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise InputError(f"{path}: group {group!r}: expected a list of host names")
        inventory.groups.setdefault(group, [])
        inventory.groups[group] += [m for m in members if m not in inventory.groups[group]]
        inventory.group_files[group] = str(path)


def scan_inventory(directory: Path | None = None) -> Inventory:
    """Load every host file (``*.yaml`` but groups.yaml) of the inventory directories; bad files are collected,
    not raised.

    Two files claiming one name both become unusable (which one was meant cannot be known). A missing default
    inventory is empty; a missing inventory the user chose (flag or $DDTREE_INVENTORY) is an error.
    """
    directories, shadowed, explicit = _inventory_dirs(directory)
    inventory = Inventory(directories, shadowed=shadowed)
    sources: dict[str, str] = {}
    for root, origin in directories:
        if not root.is_dir():
            if explicit:
                raise InputError(f"{root}: inventory directory not found (set --inventory or DDTREE_INVENTORY)")
            log.debug("no inventory at %s (the %s default); no hosts from it", root, origin)
            continue
        for path in sorted(root.glob("*.yaml")):
            if path.name == GROUPS_FILE:
                _read_groups(path, inventory)
                continue
            _add_file(inventory, sources, path, origin)
    for host in inventory.hosts.values():
        for group in host.groups:
            members = inventory.groups.setdefault(group, [])
            if host.name not in members:
                members.append(host.name)
    for group in inventory.groups:
        if group in inventory.hosts or group in inventory.broken:
            raise InputError(f"{inventory.group_files.get(group) or inventory.hosts[group].source}: group {group!r} "
                             "has the name of a host", hint="give the group a name no host has")
    log.debug("inventory %s: %d host(s), %d unusable, %d group(s)", inventory.describe(), len(inventory.hosts),
              len(inventory.broken), len(inventory.groups))
    return inventory


def _add_file(inventory: Inventory, sources: dict[str, str], path: Path, origin: str) -> None:
    try:
        host = load_host_file(path, origin)
    except InputError as exc:
        for name in _names_in(path):
            inventory.broken.setdefault(name, exc)
            inventory.broken_files.setdefault(name, str(path))
        return
    if host.name in sources:
        both = "" if Path(sources[host.name]).parent == path.parent else (
            "; a checkout reads its hosts/ and the user inventory both: keep one of the two files")
        exc = InputError(f"{path}: host name {host.name!r} already defined in {sources[host.name]}",
                         hint="give each host file its own 'name'" + both)
        inventory.hosts.pop(host.name, None)
        inventory.broken[host.name] = exc
        inventory.broken_files[host.name] = str(path)
        return
    sources[host.name] = str(path)
    if host.name not in inventory.broken:  # a duplicate of a file already found broken stays out too
        inventory.hosts[host.name] = host


def load_inventory(directory: Path | None = None) -> dict[str, Host]:
    """The usable hosts of the inventory, by name; each bad file is reported as a warning and left out."""
    inventory = scan_inventory(directory)
    inventory.warn()
    return inventory.hosts


def resolve_host(name: str, directory: Path | None = None) -> Host:
    """A host by name (or by the path of its YAML file). A host whose file is bad is an error (exit 2)."""
    path = host_file_path(name)
    if path is not None:
        return load_host_file(path)
    inventory = scan_inventory(directory)
    inventory.warn(skip=[name])
    return inventory.get(name)
