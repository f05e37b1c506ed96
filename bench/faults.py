"""Fault injection against a real sandbox host: does the deploy transaction hold under cuts, Ctrl-C, kill -9, a full
disk, concurrent commands, a server that crashes, exits or wedges at start, and a corrupted snapshot store?

Every trial drives the real command line (``python -m ddtree_deploy apply ...``) against a sandbox host whose server
is the reference engine (real decoding on the overlay's own DDTree runtime), injects one fault, and then checks:

  package   the installed sglang is byte-identical to before the suite
  state     nothing is pending; `current` is the active release, which is good (the last good one, or the new one
            when the faulted run got to its verdict)
  serving   `ddtree-deploy probe` passes on the host (the server runs the active release and decodes it correctly)
  lock      the host lock is free, with no stray lock/staging/partial files
  rerun     the same command run again succeeds
  true-words  every "…; rolled back to …; probing it" line of the run is backed by the host journal's mark of that
            rollback (no false "probe stage … failed" after a silent reconnect)

A trial "held" when every check passed. Faults:

  cut-push      SIGKILL of the host's per-connection sshd while the release is being built (.partial-* exists)
  cut-<point>   the same at other points of push, switch, restart, probe and finish (host-side fault points pause
                the remote step there; time points follow the CLI's progress lines)
  sigint-/sigkill-<stage>   SIGINT / SIGKILL of the CLI at each stage
  disk-<size>   the release root (a tmpfs in the host's mount namespace) full but for <size> bytes
  apply+apply, apply+stop   a second apply, or `server stop`, while an apply probes
  crash/exit/hang-start     a release whose server crashes (traceback), exits silently, or wedges at start
  corrupt-blob  a blob of the snapshot store corrupted before apply
  guardian-killed           SIGKILL of the run's host-side lock holder at six moments (the CLI settles the host)
  sshd-restart[+guardian]   the host's sshd restarted during the probe; the guardian lives on (or dies with it)
  disk-after-switch[+cut]   the release root filled to the last byte once `current` moved (a failing release, so
                            the run rolls back on the full disk; or a cut, so the guardian does)
  rollback-break-lock       `rollback --break-lock` while an apply probes a slow-starting release (five moments)
  hotfix-at-build           a replaced file edited on the host while the build is held at build:verified (five files)
  root-<spelling>   release_root spelt to resolve into the package on the host (lib64, a symlink, `..` after one,
                a trailing slash, a symlinked entry): hosts check, snapshot and apply refuse it, the host unchanged
  flood, reply-<kind>, tar-<kind>, patchset-<kind>   hostile inputs: a host printing 200 MiB, malformed replies,
                a tar member declared at 1.5 GiB, patch sets with a .pyc, a binary or a hard link (memory bounded)
  yaml-<kind>   hostile YAML: `command_timeout: .inf`, a key given twice in a host file or a patchset.yaml (exit 2
                naming the file and key; a host file before any host is contacted, a patchset.yaml before any push)

Run: ``make faults`` (``python bench/faults.py --trials 20``): results in bench/results/faults.md and faults.json
(``--cases ... --merge`` reruns some cases and keeps the other rows, each naming the run it comes from).
The test suite runs a short form (tests/test_faults.py and tests/test_faults_host.py, one trial of a selection).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the tests' host-file helper

from ddtree_deploy.inventory import Host, load_host_file  # noqa: E402
from ddtree_deploy.release import ReleaseManager  # noqa: E402
from ddtree_deploy.sandbox import DEFAULT_HOSTS, Sandbox, SandboxHost, _free_port  # noqa: E402
from ddtree_deploy.transport import HostConnection  # noqa: E402
from standin.helpers import write_host_yaml  # noqa: E402

HOST_ROOT = "/srv/ddtree-host"
#: The tool's own stderr lines that mark a stage, for faults timed from the outside.
LINES = {"push": "pushing ", "switched": "switched current", "restart": "restarting the server on",
         "startup": "probe stage startup", "generation": "probe stage generation", "plan": "applying patch set"}
#: Faulty runtimes: appended to the vendored DDTree runtime's __init__.py; they fire only inside the server (the
#: reference engine), not in the probe's own import of the runtime, so they fail at start like a broken release.
#: The same faults for the test stand-in server (tests/standin), read from a file the runtime carries.
STANDIN_MODES = {"crash": "crash", "exit": "exit", "hang": "wedge", "slow": "slowload"}
VARIANTS = {
    "a": "# fault suite: variant a\n",
    "b": "# fault suite: variant b\n",
    "crash": "import sys as _s\nif 'ddtree_refengine' in _s.modules:\n    raise RuntimeError('fault suite: scripted crash at start')\n",
    "exit": "import sys as _s, os as _o\nif 'ddtree_refengine' in _s.modules:\n    _o._exit(3)\n",
    "hang": "import sys as _s, time as _t\nif 'ddtree_refengine' in _s.modules:\n    _t.sleep(10 ** 6)\n",
    # a good release whose server takes SLOW_START s to come up, logging as it loads (a second command meets its probe)
    "slow": "import sys as _s, time as _t\nif 'ddtree_refengine' in _s.modules:\n    for _i in range(24):\n"
            "        _s.stderr.write('fault suite: loading %d/24\\n' % _i); _s.stderr.flush(); _t.sleep(0.5)\n",
}
SLOW_START = 12.0


@dataclass
class Trial:
    case: str
    point: str
    held: bool
    checks: dict[str, bool]
    exit_code: int | None
    seconds: float
    message: str = ""
    notes: dict[str, Any] = field(default_factory=dict)


#: The run's own rollback line (deploy._roll_back), said once the host did it: "<host>: <why>; rolled back to <where>;
#: probing it"; and the wording of old, said before the host was asked (false after a silent reconnect: #26).
_WHY = r"(?:^|\s)[\w.-]+: (probe stage \S+ failed: (?:(?!probe stage ).)*?|probe failed)"
_ROLLED_BACK = re.compile(_WHY + r"; rolled back to ([^;]+?); probing it")
_ROLLING_BACK = re.compile(_WHY + r"; rolling back\b")


def untrue_rollback_lines(text: str, journal: list[dict[str, Any]]) -> list[str]:
    """The CLI's rollback lines that the host does not back: each "…; rolled back to …; probing it" needs the host
    journal's mark of the failed release as bad with that reason (the run's own rollback writes it before the line
    is printed; the guardian's marks "interrupted"), and the old "probe stage … failed: …; rolling back" is never
    said. Lines are compared with whitespace collapsed (the console wraps long lines)."""
    flat = " ".join(text.split())
    marks = [" ".join(str(e.get("note", "")).split()) for e in journal
             if e.get("event") == "mark" and e.get("status") == "bad"]
    bad = [m.group(0).strip() for m in _ROLLED_BACK.finditer(flat)
           if not any(note and m.group(1).startswith(note) for note in marks)]
    bad += [m.group(0).strip()[-300:] for m in _ROLLING_BACK.finditer(flat)]
    return bad


class Cli:
    """One run of the command line, its stderr read line by line (so faults can follow its progress)."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "ddtree_deploy", *args], cwd=REPO, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[str] = []
        self.out = ""
        self._seen = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._out = threading.Thread(target=self._read_out, daemon=True)
        self._out.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._seen:
                self.lines.append(line)
                self._seen.notify_all()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        self.out = self.proc.stdout.read()

    def wait_line(self, text: str, timeout: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._seen:
            while not any(text in ln for ln in self.lines):
                if self.proc.poll() is not None and not self._reader.is_alive():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._seen.wait(min(left, 0.05))
        return True

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def finish(self, timeout: float = 240.0) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
            self.lines.append(f"[fault suite: killed after {timeout:g} s]\n")
        self._reader.join(5)
        self._out.join(5)
        return code

    @property
    def text(self) -> str:
        return "".join(self.lines) + self.out


class FaultBench:
    """The suite's host (a copy of the sandbox base host with its own release root and server port) and its faults."""

    def __init__(self, sandbox_host: SandboxHost, base: Host, work: Path, log: Callable[[str], None] = print,
                 engine: str = "refengine", box: Sandbox | None = None) -> None:
        """``engine``: the server the host runs: "refengine" (the reference engine: real decoding with the overlay's
        runtime; `make faults`) or "standin" (tests/standin: starts in a fraction of the time; the short form).
        ``box``: the sandbox the host belongs to (the sshd-restart faults start its sshd again)."""
        self.sbox, self.work, self.log, self.engine, self.box = sandbox_host, Path(work), log, engine, box
        self.work.mkdir(parents=True, exist_ok=True)
        self.inventory = self.work / "hosts"
        if engine == "standin":
            from standin.helpers import STANDIN_PATH, install_standin

            install_standin(base)
            base = dataclasses.replace(base, server=dict(
                base.server, command="{python} " + STANDIN_PATH + f" --host {{host}} --port {{port}} --load-seconds {SLOW_START:g} {{ddtree_flags}}"))
        self.stall = 2.0 if engine == "standin" else 6.0  # the stand-in logs its start at once: 2 s of silence is a wedge
        self.host = self._host(base, "faults", _free_port(exclude={sandbox_host.server_port, sandbox_host.ssh_port}))
        self.env = {**os.environ, "DDTREE_INVENTORY": str(self.inventory), "DDTREE_SNAPSHOTS": str(self.work / "snapshots"),
                    "COLUMNS": "200", "PYTHONUNBUFFERED": "1", "DDTREE_LEASE_TIMEOUT": "20"}
        self.patchsets = {name: self._variant(name, code) for name, code in VARIANTS.items()}
        self.manifest: dict[str, Any] | None = None
        self._private_roots: set[str] = set()  # hosts whose release root is mounted inside their namespace only
        self.digests: dict[str, str] = {}  # overlay digest -> variant

    # -- setup -------------------------------------------------------------------------------------------------------
    def _host(self, base: Host, name: str, port: int, root: str | None = None) -> Host:
        host = dataclasses.replace(
            base, name=name, release_root=root or f"{HOST_ROOT}/{name}",
            server=dict(base.server, port=port, stop_timeout=10.0),
            probe=dict(base.probe, startup_timeout=60.0, startup_stall_timeout=self.stall, generation_timeout=60.0))
        path = write_host_yaml(host, self.inventory)
        return load_host_file(path)

    def _variant(self, name: str, code: str) -> Path:
        dest = self.work / "patches" / name
        if not dest.exists():
            for folder in ("runtime", "spec-v1", "sglang-0.5.11"):  # the series and what it vendors
                shutil.copytree(REPO / "patches" / "ddtree" / folder, dest / folder)
            init = dest / "runtime" / "__init__.py"
            init.write_text(init.read_text() + "\n" + code)
            if name in STANDIN_MODES:
                (dest / "runtime" / "standin_mode").write_text(STANDIN_MODES[name])
        return dest / "sglang-0.5.11"

    def cli(self, *args: str, host: Host | None = None) -> Cli:
        return Cli([*args], self.env)

    def apply(self, variant: str, *extra: str, host: Host | None = None) -> Cli:
        h = host or self.host
        return self.cli("apply", "--host", h.name, "--patchset", str(self.patchsets[variant]), *extra)

    def setup(self) -> None:
        """A fresh release root with one good release (variant a), and the installed package recorded."""
        self._remove_root(self.host)
        run = self.apply("a")
        code = run.finish()
        if code != 0:
            raise RuntimeError(f"fault suite setup: the first apply failed ({code}):\n{run.text[-3000:]}")
        with HostConnection(self.host) as conn:
            self.manifest = ReleaseManager(conn).installed_manifest()
        from ddtree_deploy.patchset import SnapshotBase, build_overlay, load_patchset
        from ddtree_deploy.snapshot import SnapshotStore

        store = SnapshotStore(Path(self.env["DDTREE_SNAPSHOTS"]))
        base = SnapshotBase(store.latest(self.host.name), store=store)
        for name, path in self.patchsets.items():
            overlay = build_overlay(load_patchset(path), base)
            self.digests[overlay.digest] = name
            self.replaced = sorted(f.path for f in overlay.files if f.action == "replace")

    def teardown(self) -> None:
        self._remove_root(self.host)

    def _remove_root(self, host: Host) -> None:
        with HostConnection(host) as conn:
            from ddtree_deploy.server import ServerControl

            ServerControl(conn).stop()
            conn.run(f"umount {host.release_root} 2>/dev/null; rm -rf {host.release_root}", check=False)

    # -- observing the host -------------------------------------------------------------------------------------------
    def show(self, host: Host | None = None) -> dict[str, Any]:
        with HostConnection(host or self.host) as conn:
            return ReleaseManager(conn).show(journal_lines=30)

    def active_variant(self, host: Host | None = None) -> str:
        info = self.show(host)
        active = info["state"]["active"]
        rel = next((r for r in info["state"]["releases"] if r["id"] == active), {})
        return self.digests.get(rel.get("overlay_digest", ""), "a")

    def next_variant(self, host: Host | None = None) -> str:
        return "b" if self.active_variant(host) == "a" else "a"

    def wait_unlocked(self, host: Host | None = None, timeout: float = 120.0) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                if self.show(host)["lock"] is None:
                    return time.monotonic() - t0
            except Exception:
                pass
            time.sleep(0.2)
        return -1.0

    def strays(self, host: Host | None = None) -> list[str]:
        """Files a run must never leave behind: lock temporaries, half-built releases, staging dirs, temp links."""
        h = host or self.host
        with HostConnection(h) as conn:
            r = conn.run(f"cd {h.release_root} && find . -maxdepth 2 \\( -name 'lock.*' -o -name '.partial-*' "
                         f"-o -name '.current-*' -o -name '*.tmp-*' -o -path './staging/*' \\) -print", check=False)
        return r.text().split()

    # -- faults --------------------------------------------------------------------------------------------------------
    def cut(self) -> int:
        """SIGKILL every per-connection sshd of the host (the children of its listener): every connection dies."""
        kids = subprocess.run(["pgrep", "-P", str(self.sbox.pid)], capture_output=True, text=True).stdout.split()
        for pid in kids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        return len(kids)

    def _local(self, host: Host | None, path: str) -> Path:
        """A host path as seen from here (the host's private tree is the sandbox's directory)."""
        return self.sbox.fs / Path(path).relative_to(HOST_ROOT)

    def kill_guardian(self, host: Host | None = None) -> int | None:
        """SIGKILL the host-side holder of the lock (the run's guardian); its pid is in the lock record."""
        h = host or self.host
        try:
            pid = json.loads(self._local(h, h.release_root + "/lock").read_text())["holder_pid"]
        except (OSError, ValueError, KeyError):
            return None
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            return None
        return int(pid)

    def restart_sshd(self, *, kill_guardian: bool = False) -> None:
        """The host's sshd restarted: the listener and every per-connection sshd stopped (SIGTERM: every session's
        channel dies), then a new listener on the same port. ``kill_guardian``: the restart takes the run's guardian
        along (a unit that kills its whole control group)."""
        if self.box is None:
            raise RuntimeError("restart_sshd needs the sandbox (FaultBench(box=...))")
        if kill_guardian:
            self.kill_guardian()
        kids = subprocess.run(["pgrep", "-P", str(self.sbox.pid)], capture_output=True, text=True).stdout.split()
        for pid in [*kids, str(self.sbox.pid)]:
            try:
                os.kill(int(pid), signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and Path(f"/proc/{self.sbox.pid}").exists():
            try:
                os.waitpid(self.sbox.pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.02)
        self.box._start_sshd(self.sbox)
        state = self.box.load_state()
        state.hosts[self.sbox.name].pid = self.sbox.pid
        self.box.save_state(state)

    def pause_at(self, point: str, host: Host | None = None) -> None:
        h = host or self.host
        with HostConnection(h) as conn:
            conn.run(f"echo '[\"{point}\"]' > {h.release_root}/.fault-points")

    def wait_paused(self, timeout: float = 60.0, host: Host | None = None) -> bool:
        """Wait until the host's remote step reached the paused point (the file lives on the host's private tree,
        seen here through the sandbox's directory; a release root mounted inside the host's namespace, the tmpfs of
        the disk host, is looked at over SSH)."""
        h = host or self.host
        reached = self.sbox.fs / Path(h.release_root).relative_to(HOST_ROOT) / ".fault-reached"
        deadline = time.monotonic() + timeout
        private = h.name in self._private_roots
        conn = HostConnection(h) if private else None
        try:
            while not (conn.run(f"test -e {h.release_root}/.fault-reached", check=False).ok if conn else reached.exists()):
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.005)
        finally:
            if conn is not None:
                conn.close()
        return True

    def resume(self, host: Host | None = None) -> None:
        h = host or self.host
        if h.name in self._private_roots:
            with HostConnection(h) as conn:
                conn.run(f"rm -f {h.release_root}/.fault-points {h.release_root}/.fault-reached")
            return
        local = self.sbox.fs / Path(h.release_root).relative_to(HOST_ROOT)
        (local / ".fault-points").unlink(missing_ok=True)
        (local / ".fault-reached").unlink(missing_ok=True)

    # -- checks --------------------------------------------------------------------------------------------------------
    def check(self, before: str | None, known_before: set[str], host: Host | None = None, *,
              rerun: Callable[[], Cli] | None = None, probe: bool = True) -> tuple[dict[str, bool], dict[str, Any]]:
        h = host or self.host
        notes: dict[str, Any] = {}
        settle = self.wait_unlocked(h)
        notes["settle_s"] = round(settle, 2)
        info = self.show(h)
        st = info["state"]
        active = st["active"]
        rel = next((r for r in st["releases"] if r["id"] == active), None)
        link = info["current"]
        expect_link = f"releases/{active}" if active else "base"
        checks = {
            "lock": info["lock"] is None and not self.strays(h),
            # the last good release, or the new one when its verdict (good) was recorded before the fault hit
            "state": (st.get("pending") is None and link == expect_link
                      and (active is None or (rel is not None and rel.get("status") == "good"))
                      and (active == before or active not in known_before)),
        }
        notes.update(active=active, before=before, strays=self.strays(h))
        with HostConnection(h) as conn:
            checks["package"] = ReleaseManager(conn).installed_manifest() == self.manifest
        if probe:  # what `ddtree-deploy probe` runs, in this process (no start-up cost per trial)
            from ddtree_deploy.probe import Prober

            with HostConnection(h) as conn:
                result = Prober(conn).run(active)
            checks["serving"] = result.ok
            if not result.ok:
                notes["probe"] = json.dumps(result.to_dict(), default=str)[-1500:]
        if rerun is not None:
            again = rerun()
            code = again.finish()
            checks["rerun"] = code == 0 and self.wait_unlocked(h, 30) >= 0
            if code != 0:
                notes["rerun"] = again.text[-1500:]
        return checks, notes

    def trial(self, case: str, point: str, fault: Callable[[], tuple[int | None, str, bool]], *,
              host: Host | None = None, rerun: Callable[[], Cli] | None = None, probe: bool = True) -> Trial:
        h = host or self.host
        self.resume(h)
        st0 = self.show(h)["state"]
        before, known = st0["active"], {r["id"] for r in st0["releases"]}
        t0 = time.monotonic()
        try:
            code, text, run_ok = fault()
        finally:
            self.resume(h)
        seconds = time.monotonic() - t0
        with HostConnection(h) as conn:  # before the re-run: the faulted run's own journal lines are the last ones
            journal = ReleaseManager(conn).show(journal_lines=200)["journal"]
        false_lines = untrue_rollback_lines(text, journal)
        checks, notes = self.check(before, known, h, rerun=rerun, probe=probe)
        checks["true-words"] = not false_lines
        if false_lines:
            notes["untrue"] = false_lines[:3]
        notes["exit_ok"] = run_ok
        held = all(checks.values())
        message = next((ln.strip() for ln in reversed(text.splitlines()) if "error:" in ln or ": ok" in ln
                        or "rolled-back" in ln or "unchanged" in ln), text.strip().splitlines()[-1] if text.strip() else "")
        trial = Trial(case, point, held, checks, code, round(seconds, 2), message[:300], notes)
        if not held or seconds > 30:  # a failed or a slow trial keeps the CLI's output for the record
            trial.notes["output"] = text[-3000:]
        self.log(f"  {case:<16} {point:<22} {'held' if held else 'FAILED'}  exit {code}  {seconds:5.1f} s  "
                 + ("" if held else json.dumps({k: v for k, v in checks.items() if not v})))
        return trial

    # -- the cases ---------------------------------------------------------------------------------------------------
    def _apply_next(self, *extra: str) -> tuple[Cli, str]:
        variant = self.next_variant()
        return self.apply(variant, *extra), variant

    def _rerun(self, variant: str) -> Callable[[], Cli]:
        return lambda: self.apply(variant)

    def cut_at(self, point: str) -> Trial:
        """Cut every connection at ``point``: a host-side fault point ("build:linked") or "<line>+<seconds>"."""
        variant = self.next_variant()

        def fault() -> tuple[int | None, str, bool]:
            if ":" in point:
                self.pause_at(point)
            run = self.apply(variant)
            self._reach(run, point)
            self.cut()
            self.resume()
            code = run.finish()
            return code, run.text, code == 0

        return self.trial("cut", point, fault, rerun=self._rerun(variant))

    def cut_mid_push(self, i: int) -> Trial:
        """Defect 1's reproduction: as soon as releases/.partial-* appears, kill the host's sshd. Every other trial
        pauses the build there first (the exact point), the others race it."""
        variant = self.next_variant()
        paused = i % 2 == 0
        releases = self.sbox.fs / Path(self.host.release_root).relative_to(HOST_ROOT) / "releases"

        def fault() -> tuple[int | None, str, bool]:
            if paused:
                self.pause_at("build:linked")
            run = self.apply(variant)
            if paused:
                if not self.wait_paused():
                    raise RuntimeError(f"the build never reached build:linked:\n{run.text[-2000:]}")
            else:
                deadline = time.monotonic() + 60
                while not any(p.name.startswith(".partial-") for p in releases.iterdir()) and time.monotonic() < deadline:
                    time.sleep(0.001)
            self.cut()
            self.resume()
            code = run.finish()
            return code, run.text, code == 0

        return self.trial("cut-push", "paused at .partial" if paused else "on .partial (race)", fault,
                          rerun=self._rerun(variant))

    def _reach(self, run: Cli, point: str) -> None:
        if ":" in point:
            if not self.wait_paused():
                raise RuntimeError(f"fault point {point} was never reached:\n{run.text[-2000:]}")
            return
        line, _, delay = point.partition("+")
        if not run.wait_line(LINES[line]):
            raise RuntimeError(f"the CLI never printed {LINES[line]!r}:\n{run.text[-2000:]}")
        time.sleep(float(delay or 0))

    def signal_at(self, sig: int, point: str) -> Trial:
        variant = self.next_variant()
        name = {signal.SIGINT: "sigint", signal.SIGKILL: "sigkill"}[sig]
        said: list[str] = []

        def fault() -> tuple[int | None, str, bool]:
            if ":" in point:
                self.pause_at(point)
            run = self.apply(variant)
            self._reach(run, point)
            run.signal(sig)
            time.sleep(0.05)
            self.resume()
            code = run.finish()
            said.append(run.text)
            ok = code == 0
            if sig == signal.SIGINT and code not in (0, 130):
                ok = False
            return code, run.text, ok

        trial = self.trial(name, point, fault, rerun=self._rerun(variant))
        if sig == signal.SIGINT and trial.exit_code == 130:
            text = said[0] if said else ""
            trial.checks["says-what-it-did"] = "rolled back" in text or "nothing" in text
            trial.held = all(trial.checks.values())
        return trial

    def server_failure(self, variant: str) -> Trial:
        run = self.apply(variant)

        def fault() -> tuple[int | None, str, bool]:
            code = run.finish()
            return code, run.text, False

        good = self.next_variant()
        trial = self.trial(f"{variant}-start", "start-up", fault, rerun=self._rerun(good))
        trial.checks["rolled-back"] = trial.exit_code == 1 and "rolled back" in run.text
        trial.held = all(trial.checks.values())
        stage = [ln for ln in run.lines if "failed" in ln and "probe stage" in ln]
        trial.notes["failure"] = stage[0].strip()[:200] if stage else ""
        return trial

    def concurrent_apply(self) -> Trial:
        variant = self.next_variant()

        def fault() -> tuple[int | None, str, bool]:
            one, two = self.apply(variant), self.apply(variant)
            codes = sorted([one.finish(), two.finish()])
            text = one.text + two.text
            refused = "another deploy is in progress" in text
            return (0 if codes == [0, 1] and refused else 99), text, True

        trial = self.trial("apply+apply", "both at once", fault, rerun=self._rerun(variant))
        trial.checks["one-refused"] = trial.exit_code == 0
        trial.held = all(trial.checks.values())
        return trial

    def concurrent_stop(self) -> Trial:
        run, variant = self._apply_next()

        def fault() -> tuple[int | None, str, bool]:
            run.wait_line(LINES["startup"])
            stop = self.cli("server", "stop", self.host.name)
            stop_code = stop.finish()
            code = run.finish()
            ok = code == 0 and stop_code == 1 and "another deploy is in progress" in stop.text
            return (code if ok else 99), run.text + stop.text, code == 0

        trial = self.trial("apply+stop", "stop during probe", fault, rerun=self._rerun(variant))
        trial.checks["stop-refused"] = trial.exit_code == 0
        trial.checks["new-release-good"] = self.show()["state"]["active"] != trial.notes.get("before")
        trial.held = all(trial.checks.values())
        return trial

    def corrupt_blob(self) -> Trial:
        from ddtree_deploy.snapshot import SnapshotStore

        store = SnapshotStore(Path(self.env["DDTREE_SNAPSHOTS"]))
        run_holder: dict[str, Cli] = {}
        variant = self.next_variant()

        def fault() -> tuple[int | None, str, bool]:
            snap = store.latest(self.host.name)
            blob = store.blob_path(snap.manifest["sglang/srt/server_args.py"]["sha256"])
            blob.chmod(0o644)
            data = bytearray(blob.read_bytes())
            data[100] ^= 0xFF
            blob.write_bytes(bytes(data))
            run_holder["run"] = run = self.apply(variant)
            code = run.finish()
            return code, run.text, code == 0

        trial = self.trial("corrupt-blob", "server_args.py blob", fault, rerun=self._rerun(variant))
        snap = store.latest(self.host.name)
        trial.checks["store-intact"] = store.verify(snap) == []
        trial.checks["repaired"] = "fresh snapshot" in run_holder["run"].text
        trial.held = all(trial.checks.values())
        return trial

    # -- a full disk ----------------------------------------------------------------------------------------------------
    def disk_host(self) -> Host:
        if not hasattr(self, "_disk"):
            port = _free_port(exclude={self.sbox.server_port, self.sbox.ssh_port, int(self.host.server["port"])})
            self._disk = self._host(self.host, "faults-disk", port)
            h = self._disk
            self._remove_root(h)
            with HostConnection(h) as conn:
                conn.run(f"mkdir -p {h.release_root} && mount -t tmpfs -o size=256m tmpfs {h.release_root}")
            self._private_roots.add(h.name)
            run = self.apply("a", host=h)
            if run.finish() != 0:
                raise RuntimeError(f"fault suite: first apply on the tmpfs host failed:\n{run.text[-3000:]}")
        return self._disk

    def disk_full(self, free: int) -> Trial:
        h = self.disk_host()
        variant = self.next_variant(h)
        filler = f"{h.release_root}/.filler"

        def fault() -> tuple[int | None, str, bool]:
            with HostConnection(h) as conn:
                conn.run(f"rm -f {filler}; avail=$(( $(stat -f -c '%a*%S' {h.release_root}) )); "
                         f"fallocate -l $(( avail - {free} > 0 ? avail - {free} : 1 )) {filler}")
            run = self.apply(variant, "--force", host=h)
            code = run.finish()
            with HostConnection(h) as conn:
                conn.run(f"rm -f {filler}")
            return code, run.text, code == 0

        def rerun() -> Cli:
            return self.apply(variant, host=h)

        trial = self.trial(f"disk-{_size(free)}", f"{free} bytes free", fault, host=h, rerun=rerun)
        clear = "no space left" in trial.message.lower() or trial.exit_code == 0
        trial.checks["clear-error"] = clear and "Traceback" not in trial.notes.get("output", "")
        trial.held = all(trial.checks.values())
        return trial

    def teardown_disk(self) -> None:
        if hasattr(self, "_disk"):
            self._remove_root(self._disk)

    # -- harder faults: a dead guardian, sshd restarted, the disk full after the switch, a second command, a hotfix ---
    def _fault_run(self, point: str, inject: Callable[[], Any], variant: str, *extra: str,
                   host: Host | None = None) -> tuple[Cli, int]:
        """Apply ``variant``, reach ``point`` (a host-side pause or a CLI line), ``inject`` the fault, let it go on."""
        h = host or self.host
        if ":" in point:
            self.pause_at(point, h)
        run = self.apply(variant, *extra, host=h)
        if ":" in point:
            if not self.wait_paused(host=h):
                raise RuntimeError(f"fault point {point} was never reached:\n{run.text[-2000:]}")
        else:
            self._reach(run, point)
        inject()
        self.resume(h)
        return run, run.finish()

    def guardian_killed(self, point: str) -> Trial:
        """SIGKILL of the run's guardian at ``point``: the CLI sees its lease end within seconds, settles the host
        itself (back to the last good release, server restarted there, `pending` cleared, the dead lock removed) and
        says so, instead of waiting for a guardian that is gone."""
        variant = self.next_variant()
        took: dict[str, float] = {}

        def fault() -> tuple[int | None, str, bool]:
            def inject() -> None:
                if self.kill_guardian() is None:
                    raise RuntimeError("no guardian to kill")
                took["killed"] = time.monotonic()
            run, code = self._fault_run(point, inject, variant)
            took["ended"] = time.monotonic()
            said["text"] = run.text
            return code, run.text, code == 0

        said: dict[str, str] = {}
        trial = self.trial("guardian-killed", point, fault, rerun=self._rerun(variant))
        text = said.get("text", "")
        trial.notes["detected_s"] = round(took.get("ended", 0) - took.get("killed", 0), 2)
        trial.checks["no-false-wait"] = "settles the run on its own" not in text and trial.notes["detected_s"] < 30
        trial.held = all(trial.checks.values())
        return trial

    def sshd_restarted(self, point: str, *, guardian_dies: bool) -> Trial:
        """The host's sshd restarted at ``point`` of the probe: the run's SSH session dies; its guardian either lives
        (it settles the run itself) or dies with it (the CLI settles the host once it is back)."""
        variant = self.next_variant()

        def fault() -> tuple[int | None, str, bool]:
            run, code = self._fault_run(point, lambda: self.restart_sshd(kill_guardian=guardian_dies), variant)
            said["text"] = run.text
            return code, run.text, code == 0

        said: dict[str, str] = {}
        case = "sshd-restart+guardian" if guardian_dies else "sshd-restart"
        trial = self.trial(case, point, fault, rerun=self._rerun(variant))
        text = said.get("text", "")
        trial.checks["no-false-wait"] = "settles the run on its own" not in text
        trial.held = all(trial.checks.values())
        return trial

    def disk_full_after_switch(self, point: str, *, cut: bool) -> Trial:
        """The release root's disk filled to the last byte once `current` moved (at ``point``). Without a cut the new
        release fails at start (the "crash" variant), so the run itself rolls back on the full disk; with a cut the
        guardian does. Either way: back on the last good release, nothing pending, the server serving it."""
        h = self.disk_host()
        good = self.next_variant(h)
        variant = good if cut else "crash"
        filler = f"{h.release_root}/.filler"

        def fill() -> None:
            with HostConnection(h) as conn:
                conn.run(f"rm -f {filler}; avail=$(( $(stat -f -c '%a*%S' {h.release_root}) )); "
                         f"fallocate -l $(( avail > 0 ? avail : 1 )) {filler}", check=False)
            if cut:
                self.cut()

        def fault() -> tuple[int | None, str, bool]:
            try:
                run, code = self._fault_run(point, fill, variant, "--force", host=h)
            finally:
                self.wait_unlocked(h)
                with HostConnection(h) as conn:
                    conn.run(f"rm -f {filler}")
            said["text"] = run.text
            return code, run.text, code == 0

        said: dict[str, str] = {}
        trial = self.trial("disk-after-switch+cut" if cut else "disk-after-switch", point, fault, host=h,
                           rerun=lambda: self.apply(good, host=h))
        text = said.get("text", "")
        trial.notes["said"] = text[-1500:]
        # the run says where the host ended (the stand-in's scripted crash puts a traceback of its own in the log tail)
        trial.checks["says-where"] = "internal error" not in text and ("rolled back" in text or trial.exit_code == 0)
        trial.held = all(trial.checks.values())
        return trial

    def break_lock_mid_probe(self, point: str = "restart+0.5") -> Trial:
        """`rollback --break-lock` while an apply probes its release (one whose server takes SLOW_START s to come up):
        the rollback settles the apply (its release rolled back, the last good one restarted) and does nothing more:
        no second rollback, nothing marked bad that passed its probe."""
        variant = self.next_variant()
        said: dict[str, str] = {}

        def fault() -> tuple[int | None, str, bool]:
            run = self.apply("slow")
            self._reach(run, point)
            back = self.cli("rollback", self.host.name, "--break-lock")
            code = back.finish()
            run.finish()
            said["rollback"], said["apply"] = back.text, run.text
            return code, back.text + run.text, code == 0

        trial = self.trial("rollback-break-lock", f"during the probe ({point})", fault, rerun=self._rerun(variant))
        st = self.show()["state"]
        before = trial.notes.get("before")
        rel = next((r for r in st["releases"] if r["id"] == before), {})
        trial.checks["good-kept"] = before is not None and rel.get("status") == "good" and before not in st["bad"]
        trial.checks["said-settled"] = "settling the run" in said.get("rollback", "")
        trial.held = all(trial.checks.values())
        return trial

    def hotfix_at_build(self, which: int = 0) -> Trial:
        """A hotfix to a file the overlay replaces (the ``which``-th, cycling) lands while the build is held at
        build:verified (after the host-side drift check): the switch's last look finds it, stops the deploy and
        names the file."""
        variant = self.next_variant()
        path = self.replaced[which % len(self.replaced)]
        local = self._local(self.host, f"{self.host.site_packages}/{path}")
        backup = self.work / "hotfix-backup"
        said: dict[str, str] = {}

        def fault() -> tuple[int | None, str, bool]:
            shutil.copy2(local, backup)
            try:
                def hotfix() -> None:
                    with open(local, "a") as fh:
                        fh.write("\n# a hotfix on the host\n")
                run, code = self._fault_run("build:verified", hotfix, variant)
            finally:
                shutil.copy2(backup, local)
            said["text"] = run.text
            return code, run.text, False

        trial = self.trial("hotfix-at-build", f"build:verified ({path.rsplit('/', 1)[-1]})", fault,
                           rerun=self._rerun(variant))
        text = said.get("text", "")
        trial.checks["refused-naming-file"] = trial.exit_code == 1 and path in text and "changed after release" in text
        trial.held = all(trial.checks.values())
        return trial


def _size(n: int) -> str:
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= div:
            return f"{n // div}{unit}"
    return f"{n}B"


# -- paths resolved on the host, and hostile inputs bounded ------------------------------------------------------------
# release_root spelt so that, on the host, it lands inside site-packages or the package (or holds a symlink there):
# each must be refused by `hosts check`, `snapshot` and `apply` before anything is written. Then hosts that answer
# with floods, malformed replies and tar members declared huge, and patch sets that carry what is not source.
# tests/cli/test_cli_hostile.py drives the same inputs through the installed console script.
HOSTILE = f"{HOST_ROOT}/hostile"
PATH_SPELLINGS = ("lib64", "symlink", "dotdot", "trailing-slash", "entry-link")
REPLY_KINDS = {  # what the host's "python" puts in place of the helper's reply line
    "not-json": "{broken",
    "not-object": "[1, 2]",
    "bad-ok": '{"ok": "yes", "result": {}}',
    "bad-result": '{"ok": true, "result": 5}',
    "huge": '{"ok": true, "result": "' + "x" * (10 << 20) + '"}',
}
FLOOD_BYTES = 200 << 20
#: Peak RSS the control side may reach while a host floods it (the CLI alone is about 60-90 MiB).
FLOOD_RSS_MAX = 300 << 20
TAR_KINDS = ("declared-huge", "not-asked-for")
TAR_DECLARED = 1536 << 20
PATCHSET_KINDS = ("patch-pyc", "runtime-pyc", "runtime-hardlink", "runtime-binary")
#: Hostile YAML: a host file with `command_timeout: .inf`, a host file with a key given twice, a patchset.yaml with a
#: key given twice (YAML alone would keep the last).
YAML_KINDS = ("timeout-inf", "host-key-twice", "patchset-key-twice")

#: A `tar` for a local host's PATH: one member declared at TAR_DECLARED bytes (the first path asked for, or one
#: that was not), then zeros until the reader goes away.
FAKE_TAR = r"""#!{python}
import os, sys, tarfile
args = sys.argv[1:]
src = args[args.index("-T") + 1]
names = (sys.stdin.buffer.read() if src == "-" else open(src, "rb").read()).split(b"\0")
info = tarfile.TarInfo(names[0].decode() if "{kind}" == "declared-huge" else "sglang/not-asked-for.py")
info.size = {size}
out = sys.stdout.buffer
out.write(info.tobuf(format=tarfile.GNU_FORMAT))
block = bytes(1 << 20)
try:
    for _ in range({size} >> 20):
        out.write(block)
except BrokenPipeError:
    os._exit(0)
"""


def root_spelling(kind: str, site_packages: str) -> tuple[str, dict[str, str]]:
    """``release_root`` spelt ``kind`` (landing inside ``site_packages`` or its sglang on the host), and the host-side
    symlinks (link -> target) it needs."""
    lib64 = site_packages.replace("/lib/", "/lib64/", 1)
    into = f"{HOSTILE}/into-package"  # a host-side symlink to a directory inside the installed package
    links = {into: f"{site_packages}/sglang/srt"}
    return {
        "lib64": (f"{lib64}/ddtree-releases", {}),  # the venv's own lib64 -> lib
        "symlink": (f"{into}/ddtree-releases", links),
        "dotdot": (f"{into}/../ddtree-releases", links),  # as text /srv/.../hostile/ddtree-releases: outside
        "trailing-slash": (f"{lib64}/./sglang/", {}),
        "entry-link": (f"{HOSTILE}/root-with-link", {f"{HOSTILE}/root-with-link/releases": f"{site_packages}/sglang"}),
    }[kind]


def hostile_python(real: str, kind: str, reply_file: str) -> str:
    """A host 'python' that floods stdout before running ``real`` (``flood``), or runs it and puts the content of
    ``reply_file`` in place of its reply line (a REPLY_KINDS key)."""
    if kind == "flood":
        return f"#!/bin/sh\nhead -c {FLOOD_BYTES} /dev/zero\nexec {real} \"$@\"\n"
    swap = (f"import sys\nr = open({reply_file!r}).read()\nfor ln in sys.stdin:\n"
            "    sys.stdout.write(r if ln.startswith('@@DDTREE-RESULT@@') else ln)\n")
    return f"#!/bin/sh\n{real} \"$@\" | {real} -S -c {_sh_quote(swap)}\n"


def _sh_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def hostile_patchset(kind: str, variant: Path, dest: Path, secret: Path) -> Path:
    """A copy of the patch-set ``variant`` (its sglang-<ver> folder) that carries something that is not source:
    a patch creating a .pyc, a loose .pyc, a hard link to ``secret`` (outside the patch set), or a binary, in its
    runtime. Returns its sglang-<ver> folder."""
    family = dest / kind
    shutil.rmtree(family, ignore_errors=True)
    shutil.copytree(variant.parent, family)
    ps = family / variant.name
    runtime = family / "runtime"
    if kind == "patch-pyc":
        (ps / "9999-pyc.patch").write_text(
            "diff --git a/sglang/srt/ddtree_hook.pyc b/sglang/srt/ddtree_hook.pyc\nnew file mode 100644\n"
            "--- /dev/null\n+++ b/sglang/srt/ddtree_hook.pyc\n@@ -0,0 +1 @@\n+not bytecode, but named as if\n")
        yml = ps / "patchset.yaml"
        yml.write_text(yml.read_text().replace("series:", "series:\n  - 9999-pyc.patch", 1))
    elif kind == "runtime-pyc":
        (runtime / "legacy.pyc").write_bytes(b"\x55\x0d\x0d\x0a" + bytes(12))
    elif kind == "runtime-hardlink":
        os.link(secret, runtime / "notes.txt")
    elif kind == "runtime-binary":
        (runtime / "kernels.cubin").write_bytes(b"\x7fELF" + bytes(64))
    return ps


def nothing_stored(store: Path, host: str) -> bool:
    """No blob (nor a temporary one) and no snapshot entry of ``host`` (nor a temporary one) in the snapshot store
    ``store``."""
    from ddtree_deploy.snapshot import SnapshotStore

    snapshots = SnapshotStore(store)
    return not snapshots.stored_blobs() and not snapshots.temporaries() and not snapshots.list(host)


def host_listing(conn: HostConnection, *roots: str) -> str:
    """sha256 of every entry under ``roots`` on the host (path, type, size, mtime, link target): any write there
    changes it (a new file changes its directory's mtime)."""
    quoted = " ".join(f"'{r}'" for r in roots)
    r = conn.run(f"find {quoted} -printf '%p %y %s %T@ %l\\n' 2>/dev/null | LC_ALL=C sort | sha256sum", check=False)
    return r.text().split()[0]


def peak_rss_cli(args: list[str], env: dict[str, str], timeout: float = 300) -> tuple[int, str, int]:
    """Run the CLI in a child and return (exit code, its output, peak RSS in bytes of the CLI and its children)."""
    measure = ("import resource, subprocess, sys\n"
               "p = subprocess.run(sys.argv[1:], capture_output=True)\n"
               "sys.stdout.buffer.write(p.stdout + p.stderr)\n"
               "sys.stderr.write('\\nRSS %d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
               "sys.exit(p.returncode)\n")
    proc = subprocess.run([sys.executable, "-c", measure, *args], env=env, capture_output=True, timeout=timeout, cwd=REPO)
    rss = int(proc.stderr.decode().rsplit("RSS ", 1)[1].split()[0]) * 1024
    return proc.returncode, proc.stdout.decode(errors="replace"), rss


class HostileBench:
    """The path and hostile-input cases, on a FaultBench's host: each trial checks its own verdict and, through
    ``FaultBench.trial``, that the fault host itself is untouched (package, state, lock)."""

    def __init__(self, bench: FaultBench) -> None:
        self.b = bench
        self.inventory = bench.work / "hosts-hostile"
        self.env = {**bench.env, "DDTREE_INVENTORY": str(self.inventory)}
        self.fs = bench.sbox.fs / Path(HOSTILE).relative_to(HOST_ROOT)
        self.site = bench.host.site_packages
        self._local: Host | None = None

    def _write(self, name: str, **changes: Any) -> Host:
        host = dataclasses.replace(self.b.host, name=name, source="", **changes)
        return load_host_file(write_host_yaml(host, self.inventory))

    def _cli(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
        run = Cli(list(args), env or self.env)
        return run.finish(), run.text

    def _listing(self) -> str:
        with HostConnection(self.b.host) as conn:
            return host_listing(conn, f"{HOST_ROOT}/venv", HOSTILE)

    def _fresh_dir(self) -> None:
        shutil.rmtree(self.fs, ignore_errors=True)
        self.fs.mkdir(parents=True)

    # -- release_root resolving into the package ------------------------------------------------------------------------
    def path_trial(self, kind: str) -> Trial:
        root, links = root_spelling(kind, self.site)
        name = "faults-paths"

        def fault() -> tuple[int | None, str, bool]:
            self._fresh_dir()
            self._write(name, release_root=f"{HOSTILE}/good-root")
            code, text = self._cli("snapshot", name)  # a fresh snapshot, so `apply` goes straight to the host
            if code != 0:
                raise RuntimeError(f"snapshot with a good root failed:\n{text[-2000:]}")
            with HostConnection(self.b.host) as conn:
                for link, target in links.items():
                    conn.run(f"mkdir -p '{os.path.dirname(link)}' && ln -sfn '{target}' '{link}'")
            bad = self._write(name, release_root=root)
            before = self._listing()
            said = {}
            for cmd in (["hosts", "check", "--json", name], ["snapshot", name],
                        ["apply", "--host", name, "--patchset", str(self.b.patchsets["a"])]):
                code, text = self._cli(*cmd)
                said[cmd[0]] = code, " ".join(text.split())  # as one line: a table or a long line may wrap it
            same = self._listing() == before
            notes.update({k: v[1].strip()[-600:] for k, v in said.items()}, identical=same)
            checks.update({f"{k}-refused": v[0] == 2 and ("resolves" in v[1] or "symlink to" in v[1])
                           for k, v in said.items()})
            checks["both-spellings"] = all(repr(bad.release_root) in v[1] and ("resolved on the host" in v[1]
                                                                              or "symlink to" in v[1])
                                           for v in said.values())
            checks["host-identical"] = same
            return said["apply"][0], "".join(v[1] for v in said.values()), all(checks.values())

        checks: dict[str, bool] = {}
        notes: dict[str, Any] = {}
        trial = self.b.trial(f"root-{kind}", root, fault, probe=False)
        return self._verdict(trial, checks, notes)

    def _verdict(self, trial: Trial, checks: dict[str, bool], notes: dict[str, Any]) -> Trial:
        trial.checks.update(checks)
        trial.notes.update(notes)
        trial.held = all(trial.checks.values())
        return trial

    # -- a host that floods, or answers malformed replies ----------------------------------------------------------------
    def _python(self, kind: str) -> Host:
        self._fresh_dir()
        reply = self.fs / "reply"
        if kind in REPLY_KINDS:
            reply.write_text("@@DDTREE-RESULT@@" + REPLY_KINDS[kind] + "\n")
        script = self.fs / f"python-{kind}"
        script.write_text(hostile_python(self.b.host.python, "flood" if kind == "flood" else "reply", f"{HOSTILE}/reply"))
        script.chmod(0o755)
        return self._write(f"faults-{kind}", python=f"{HOSTILE}/python-{kind}")

    def reply_trial(self, kind: str) -> Trial:
        checks: dict[str, bool] = {}
        notes: dict[str, Any] = {}

        def fault() -> tuple[int | None, str, bool]:
            host = self._python(kind)
            before = self._listing()
            code, text, rss = peak_rss_cli([sys.executable, "-m", "ddtree_deploy", "hosts", "check", host.name], self.env)
            notes.update(rss_mib=round(rss / 2**20, 1), said=text.strip()[-600:])
            want = "printed more than" if kind == "flood" else "malformed reply"
            checks["clear-error"] = (code != 0 and want in text and f"host {host.name}" in text
                                     and "hostinfo.check" in text and "internal error" not in text
                                     and "Traceback" not in text)
            checks["memory-bounded"] = rss < FLOOD_RSS_MAX
            checks["host-identical"] = self._listing() == before
            return code, text, all(checks.values())

        trial = self.b.trial("flood" if kind == "flood" else f"reply-{kind}",
                             f"{FLOOD_BYTES >> 20} MiB on stdout" if kind == "flood" else "hosts check", fault, probe=False)
        return self._verdict(trial, checks, notes)

    # -- tar members declared huge ------------------------------------------------------------------------------------
    def local_host(self) -> Host:
        if self._local is None:
            from ddtree_deploy.sandbox import make_local_host

            path = make_local_host(self.b.work / "local-host", self.inventory, name="faults-local")
            self._local = load_host_file(path)
        return self._local

    def tar_trial(self, kind: str) -> Trial:
        checks: dict[str, bool] = {}
        notes: dict[str, Any] = {}

        def fault() -> tuple[int | None, str, bool]:
            host = self.local_host()
            bin_dir = self.b.work / f"fake-tar-{kind}"
            bin_dir.mkdir(exist_ok=True)
            tar = bin_dir / "tar"
            tar.write_text(FAKE_TAR.format(python=sys.executable, kind=kind, size=TAR_DECLARED))
            tar.chmod(0o755)
            store = self.b.work / f"store-{kind}"
            shutil.rmtree(store, ignore_errors=True)
            env = {**self.env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DDTREE_SNAPSHOTS": str(store)}
            t0 = time.monotonic()
            code, text, rss = peak_rss_cli([sys.executable, "-m", "ddtree_deploy", "snapshot", host.name], env)
            notes.update(rss_mib=round(rss / 2**20, 1), seconds=round(time.monotonic() - t0, 1), said=text.strip()[-600:])
            checks["refused-from-header"] = code != 0 and "refused from its header" in text and "Traceback" not in text
            checks["memory-bounded"] = rss < FLOOD_RSS_MAX
            checks["nothing-stored"] = nothing_stored(store, host.name)
            return code, text, all(checks.values())

        trial = self.b.trial(f"tar-{kind}", f"{TAR_DECLARED >> 20} MiB declared", fault, probe=False)
        return self._verdict(trial, checks, notes)

    # -- hostile YAML: an infinite timeout, a key given twice ---------------------------------------------------------------
    def yaml_trial(self, kind: str) -> Trial:
        """A host file (or patchset.yaml) of YAML_KINDS: every command that reads it (hosts check and apply, or
        patchset show and apply) is exit 2 with an error naming the file and the key (a host file before any host is
        contacted; a patchset.yaml before anything is pushed: apply may take its snapshot first); the host unchanged.
        Each in an inventory of its own (a broken file there stops every command reading it)."""
        checks: dict[str, bool] = {}
        notes: dict[str, Any] = {}

        def fault() -> tuple[int | None, str, bool]:
            inv = self.b.work / f"hosts-yaml-{kind}"
            shutil.rmtree(inv, ignore_errors=True)
            name = "faults-yaml"
            path = write_host_yaml(dataclasses.replace(self.b.host, name=name, source=""), inv)
            env = {**self.b.env, "DDTREE_INVENTORY": str(inv)}
            ps = self.b.patchsets["b"]
            text = path.read_text()
            if kind == "patchset-key-twice":
                family = self.b.work / "hostile-yaml"
                shutil.rmtree(family, ignore_errors=True)
                shutil.copytree(ps.parent, family)
                ps = family / ps.name
                bad = ps / "patchset.yaml"
                doc = bad.read_text()
                first = re.search(r"^version: .*$", doc, re.M)
                if first is None:
                    raise RuntimeError(f"{bad} has no top-level version line")
                bad.write_text(doc[:first.end()] + "\nversion: 9.9.9" + doc[first.end():])
                words = [str(bad), "key 'version' is given twice"]
                runs = {"show": ("patchset", "show", str(ps))}
            elif kind == "timeout-inf":
                path.write_text(re.sub(r"^command_timeout:.*\n", "", text, flags=re.M) + "command_timeout: .inf\n")
                words = [str(path), "field 'command_timeout'", "expected a finite number of seconds"]
                runs = {"check": ("hosts", "check", name)}
            else:
                if not re.search(r"^port:", text, re.M):
                    text += "port: 22\n"
                path.write_text(text + "port: 2222\n")
                words = [str(path), "key 'port' is given twice"]
                runs = {"check": ("hosts", "check", name)}
            runs["apply"] = ("apply", "--host", name, "--patchset", str(ps))
            before = self._listing()
            said = {k: self._cli(*args, env=env) for k, args in runs.items()}
            notes.update({k: " ".join(v[1].split())[-400:] for k, v in said.items()})
            for k, (code, out) in said.items():  # compared without whitespace: the console wraps long paths
                bare = "".join(out.split())
                checks[f"{k}-refused"] = (code == 2 and all("".join(w.split()) in bare for w in words)
                                          and "Traceback" not in out)
            checks["host-identical"] = self._listing() == before
            return said["apply"][0], "".join(v[1] for v in said.values()), all(checks.values())

        point = "patchset show + apply" if kind == "patchset-key-twice" else "hosts check + apply"
        trial = self.b.trial(f"yaml-{kind}", point, fault, probe=False)
        return self._verdict(trial, checks, notes)

    # -- patch sets carrying what is not source ---------------------------------------------------------------------------
    def patchset_trial(self, kind: str) -> Trial:
        checks: dict[str, bool] = {}
        notes: dict[str, Any] = {}

        def fault() -> tuple[int | None, str, bool]:
            secret = self.b.work / "secret.txt"
            secret.write_text("a file outside the patch set\n")
            ps = hostile_patchset(kind, self.b.patchsets["b"], self.b.work / "hostile-patches", secret)
            before = self._listing()
            said = {"show": self._cli("patchset", "show", str(ps)),
                    "apply": self._cli("apply", "--host", self.b.host.name, "--patchset", str(ps), env=self.b.env)}
            said = {k: (code, " ".join(text.split())) for k, (code, text) in said.items()}
            word = {"patch-pyc": "not a source file", "runtime-pyc": "not a source file",
                    "runtime-hardlink": "is a hard link", "runtime-binary": "not a source file"}[kind]
            notes.update({k: v[1].strip()[-400:] for k, v in said.items()})
            checks.update({f"{k}-refused": v[0] == 2 and word in v[1] for k, v in said.items()})
            checks["host-identical"] = self._listing() == before
            return said["apply"][0], "".join(v[1] for v in said.values()), all(checks.values())

        trial = self.b.trial(f"patchset-{kind}", "patchset show + apply", fault, probe=False)
        return self._verdict(trial, checks, notes)


def hostile_summary(trials: list[Trial]) -> list[str]:
    """The results file's lines for this block: what a flood and a huge tar member cost the control side."""
    rss = {t.case: t.notes.get("rss_mib") for t in trials if "rss_mib" in t.notes}
    if not rss:
        return []
    worst = {k: max(v for c, v in rss.items() if c.startswith(k)) for k in ("flood", "reply", "tar") if
             any(c.startswith(k) for c in rss)}
    return ["", "Hostile inputs, peak RSS of the CLI and its children (limit " f"{FLOOD_RSS_MAX >> 20} MiB): "
            + "; ".join(f"{k} {v} MiB" for k, v in worst.items())
            + f" (flood: the host's python printed {FLOOD_BYTES >> 20} MiB; tar: one member declared at "
            f"{TAR_DECLARED >> 20} MiB). root-*: release_root spellings that the host resolves into the package, each "
            "refused by hosts check, snapshot and apply with the host's tree unchanged."
            + (" yaml-*: host files and a patchset.yaml that YAML alone would accept (an infinite timeout, a key given "
               "twice), each refused by every command that reads them, naming the file and the key."
               if any(t.case.startswith("yaml-") for t in trials) else "")]


def run_hostile(bench: FaultBench, each: int, short: bool, want: Callable[[str], bool]) -> list[Trial]:
    """The cases of this block: ``paths`` (every spelling), ``hostile`` (flood, replies, tar, patch sets) and
    ``yaml`` (an infinite timeout, keys given twice)."""
    hb, out = HostileBench(bench), []
    if want("paths"):
        out += [hb.path_trial(k) for _ in range(each) for k in (SHORT["paths"] if short else PATH_SPELLINGS)]
    if want("hostile"):
        kinds = SHORT["hostile"] if short else ["flood", *REPLY_KINDS, *TAR_KINDS, *PATCHSET_KINDS]
        for _ in range(each):
            for k in kinds:
                trial = (hb.reply_trial if k == "flood" or k in REPLY_KINDS else
                         hb.tar_trial if k in TAR_KINDS else hb.patchset_trial)(k)
                out.append(trial)
    if want("yaml"):
        out += [hb.yaml_trial(k) for _ in range(each) for k in (SHORT["yaml"] if short else YAML_KINDS)]
    return out


# -- the plan of trials ------------------------------------------------------------------------------------------------------
#: Cut points spread over push, switch, restart, probe and finish (host-side pauses and the CLI's progress lines).
CUT_POINTS = ["plan+0", "push+0", "build:verified", "build:linked", "build:committed", "switch:pending", "switch:flipped",
              "switched+0", "server:restart", "restart+0", "restart+0.2", "restart+0.5", "startup+0", "startup+0.3",
              "startup+1.0", "generation+0", "generation+0.1", "finish:start", "push+0.02", "switched+0.05", "restart+1.5"]
SIGNAL_POINTS = ["plan+0", "build:linked", "switch:pending", "server:restart", "startup+0.3", "generation+0", "finish:start"]
DISK_FREE = [0, 16 << 10, 256 << 10, 4 << 20]
#: The harder faults: moments a guardian is killed at, sshd restarts during the probe, a full disk after the switch.
GUARDIAN_POINTS = ["build:linked", "switch:pending", "server:restart", "startup+0.3", "generation+0", "finish:start"]
SSHD_POINTS = ["server:restart", "startup+0.3", "generation+0"]
DISK_AFTER_POINTS = ["switch:flipped", "server:restart", "startup+0"]
#: `rollback --break-lock` while the slow release (SLOW_START s) is probed; a hotfix to each of the first files the
#: overlay replaces while the build is held at build:verified.
BREAK_LOCK_POINTS = ["restart+0.2", "restart+0.5", "restart+2", "restart+5", "restart+9"]
HOTFIX_FILES = 5
SHORT = {  # the selection tests/test_faults.py and test_faults_host.py run (one trial each, with the stand-in server)
    "cut": ["switch:pending", "generation+0"], "sigint": ["startup+0.3"], "sigkill": ["server:restart"], "disk": [0],
    "guardian": ["startup+0.3", "finish:start"], "sshd": ["startup+0.3"], "disk-after": ["switch:flipped"],
    "paths": ["dotdot"], "hostile": ["bad-result", "patch-pyc"], "yaml": ["timeout-inf"],
}


def run_suite(bench: FaultBench, trials: int, cases: set[str] | None = None, short: bool = False) -> list[Trial]:
    """The trials: ``trials`` of the mid-push cut (at least 20), one per cut point, and ``trials // 10`` (at least
    one) of every other fault at each of its points; ``short``: the test suite's selection, one trial each."""
    out: list[Trial] = []
    want = (lambda c: c in cases) if cases else (lambda c: True)
    each = 1 if short else max(1, trials // 10)
    if want("cut-push"):
        out += [bench.cut_mid_push(i) for i in range(1 if short else max(trials, 20))]
    if want("cut"):
        out += [bench.cut_at(p) for p in (SHORT["cut"] if short else CUT_POINTS)]
    for sig, name in ((signal.SIGINT, "sigint"), (signal.SIGKILL, "sigkill")):
        if want(name):
            out += [bench.signal_at(sig, p) for _ in range(each) for p in (SHORT[name] if short else SIGNAL_POINTS)]
    if want("server"):
        out += [bench.server_failure(v) for _ in range(each) for v in (("hang",) if short else ("crash", "exit", "hang"))]
    if want("concurrent"):
        out += [t for _ in range(each) for t in (bench.concurrent_apply(), bench.concurrent_stop())]
    if want("corrupt"):
        out += [bench.corrupt_blob() for _ in range(each)]
    if want("disk"):
        out += [bench.disk_full(s) for _ in range(each) for s in (SHORT["disk"] if short else DISK_FREE)]
    # the harder faults: each at every one of its moments, ``each`` times
    if want("guardian"):
        out += [bench.guardian_killed(p) for _ in range(each) for p in (SHORT["guardian"] if short else GUARDIAN_POINTS)]
    if want("sshd"):
        points = SHORT["sshd"] if short else SSHD_POINTS
        out += [bench.sshd_restarted(p, guardian_dies=False) for _ in range(each) for p in points]
        out += [bench.sshd_restarted(p, guardian_dies=True) for _ in range(each) for p in points]
    if want("disk-after"):
        points = SHORT["disk-after"] if short else DISK_AFTER_POINTS
        out += [bench.disk_full_after_switch(p, cut=c) for _ in range(each) for c in (False, True) for p in points]
    if want("break-lock"):
        points = ["restart+0.5"] if short else BREAK_LOCK_POINTS
        out += [bench.break_lock_mid_probe(p) for _ in range(each) for p in points]
    if want("hotfix"):
        out += [bench.hotfix_at_build(i) for _ in range(each) for i in range(1 if short else HOTFIX_FILES)]
    bench.teardown_disk()
    out += run_hostile(bench, each, short, want)
    return out


def summarize(trials: list[Trial]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for t in trials:
        key = t.case
        r = rows.setdefault(key, {"case": key, "trials": 0, "held": 0, "points": set(), "seconds": [], "exit_codes": set()})
        r["trials"] += 1
        r["held"] += int(t.held)
        r["points"].add(t.point)
        r["seconds"].append(t.seconds)
        r["exit_codes"].add(t.exit_code)
    return [{**r, "points": sorted(r["points"], key=str), "exit_codes": sorted(c for c in r["exit_codes"] if c is not None),
             "median_s": sorted(r["seconds"])[len(r["seconds"]) // 2]} for r in rows.values()]


def _earlier_runs(out_dir: Path, replaced: set[str]) -> tuple[list[dict[str, Any]], list[tuple[int, Trial]]]:
    """The runs already in faults.json and their trials of the cases this run does not redo (``--merge``): each
    keeps the number of the run it came from, so every row says which command produced it."""
    path = out_dir / "faults.json"
    if not path.exists():
        return [], []
    old = json.loads(path.read_text())
    runs = old.get("runs")
    if runs is None:  # written before runs were numbered: one run, its date from the results file's first lines
        md = (out_dir / "faults.md").read_text() if (out_dir / "faults.md").exists() else ""
        date = re.search(r"\b(\d{4}-\d{2}-\d{2})\b", md)
        cores = re.search(r"on (\d+) cores", md)
        runs = [{"command": old["command"], "seconds": old["seconds"], "date": date.group(1) if date else "unknown",
                 "cores": int(cores.group(1)) if cores else None, "trials": len(old["trials"]),
                 "note": "Rows as first recorded; not re-run by the later runs below"}]
    fields = {f.name for f in dataclasses.fields(Trial)}
    kept = [(int(t.get("run", 1)), Trial(**{k: v for k, v in t.items() if k in fields}))
            for t in old["trials"] if t["case"] not in replaced]
    return runs, kept


def write_results(trials: list[Trial], command: str, seconds: float, out_dir: Path, *, merge: bool = False,
                  note: str = "") -> Path:
    """faults.md and faults.json for this run; with ``merge`` the rows of earlier runs for cases this run did not
    redo are kept, each row naming the run (command, date, machine) it comes from."""
    runs, kept = _earlier_runs(out_dir, {t.case for t in trials}) if merge else ([], [])
    this = {"command": command, "seconds": round(seconds, 1), "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "cores": os.cpu_count(), "trials": len(trials), "note": note}
    runs = [*runs, this]
    numbered = kept + [(len(runs), t) for t in trials]
    everything = [t for _, t in numbered]
    total, held = len(everything), sum(t.held for t in everything)
    md = [
        "# Fault injection: the deploy transaction under cuts, signals, a full disk, concurrency, broken servers, a dead "
        "guardian, a restarted sshd, a second command and a late hotfix",
        "",
        f"{total} trials, **{held} held**, from {len(runs)} run(s) (needs root: sandbox hosts):",
        "",
    ]
    for i, r in enumerate(runs, 1):
        cores = f" on {r['cores']} cores" if r.get("cores") else ""
        md.append(f"{i}. `{r['command']}`: {r['trials']} trials in {r['seconds'] / 60:.1f} min{cores}, {r['date']}"
                  + (f". {r['note']}" if r.get("note") else ""))
    md += [
        "",
        "Each trial drives the real CLI against a sandbox host (real sshd in its own mount namespace; the server is the",
        "reference engine decoding with the overlay's own DDTree runtime), injects one fault, then checks: the installed",
        "package byte-identical; nothing pending and the active release good (the last good one, or the new one when the",
        "run reached its verdict); `probe` passes; the lock free with no stray files; and the same command run again",
        "succeeds. A cut is SIGKILL of every per-connection sshd of the host. See bench/faults.py for each case.",
        "",
        "| case | run | trials | held | points | exit codes | median s |",
        "|---|---:|---:|---:|---|---|---:|",
    ]
    for run_no in range(1, len(runs) + 1):
        for r in summarize([t for n, t in numbered if n == run_no]):
            pts = ", ".join(str(p) for p in r["points"])
            md.append(f"| {r['case']} | {run_no} | {r['trials']} | {r['held']} | {pts} | "
                      f"{', '.join(map(str, r['exit_codes']))} | {r['median_s']:.1f} |")
    failed = [t for t in everything if not t.held]
    md += ["", "## Trials that did not hold", ""] + ([f"- {t.case} at {t.point}: {json.dumps(t.checks)} — {t.message}" for t in failed]
                                                     or ["none"])
    md += hostile_summary(everything)
    hang = [t for t in everything if t.case == "hang-start"]
    if hang:
        md += ["", f"Wedged start (log silent, /health failing) detected by the no-progress rule "
                   f"(start-up budget 60 s): {hang[0].notes.get('failure', '')}"]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "faults.md").write_text("\n".join(md) + "\n")
    (out_dir / "faults.json").write_text(json.dumps({
        "command": command, "seconds": round(seconds, 1), "runs": runs,
        "trials": [{**dataclasses.asdict(t), "run": n} for n, t in numbered]}, indent=1, default=str))
    return out_dir / "faults.md"


def _without_note(argv: list[str]) -> list[str]:
    """The command line as the results file records it: --note goes into the run's own line, not the command."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--note":
            skip = True
        elif not a.startswith("--note="):
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=20, help="trials of the mid-push cut (at least 20); other cases scale")
    p.add_argument("--cases", default="", help="comma-separated subset: cut-push,cut,sigint,sigkill,server,concurrent,"
                   "corrupt,disk,guardian,sshd,disk-after,break-lock,hotfix,paths,hostile,yaml")
    p.add_argument("--short", action="store_true", help="the short selection the test suite runs")
    p.add_argument("--engine", choices=("refengine", "standin"), default="refengine",
                   help="the host's server: the reference engine (real decoding) or the tests' stand-in (faster)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--merge", action="store_true",
                   help="keep the earlier runs' rows of the cases this run does not redo (each row names its run)")
    p.add_argument("--note", default="", help="a sentence about this run for the results file (e.g. why it is reduced)")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="ddtree-faults-"))
    box = Sandbox(tmp / "sandbox", tmp / "sandbox-hosts", log=lambda m: print(f"  {m}"))
    try:
        state = box.up(DEFAULT_HOSTS[:1])
        sbox = state.hosts[DEFAULT_HOSTS[0][0]]
        base = load_host_file(Path(sbox.inventory_file))
        bench = FaultBench(sbox, base, tmp / "work", engine=args.engine, box=box)
        print("setting up: first apply on the fault host")
        bench.setup()
        trials = run_suite(bench, args.trials, set(filter(None, args.cases.split(","))) or None, args.short)
        bench.teardown()
    finally:
        box.down()
        shutil.rmtree(tmp, ignore_errors=True)
    cmd = "make faults" if not args.cases and not args.short and args.trials == 20 else \
        "python bench/faults.py " + shlex.join(_without_note(argv or sys.argv[1:]))
    path = write_results(trials, cmd, time.monotonic() - t0, args.out, merge=args.merge, note=args.note)
    held = sum(t.held for t in trials)
    print(f"{held}/{len(trials)} trials held; {path}")
    return 0 if held == len(trials) else 1


if __name__ == "__main__":
    sys.exit(main())
