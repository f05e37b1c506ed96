"""One retry on a transient connect failure in a fleet (issue 25, item 10), through the installed console script
on the sandbox hosts: a host whose sshd comes up a moment after the apply starts is tried once more and then
deployed (here: dry-run), while a host that refuses our key is not retried (waiting does not fix it)."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from hostfiles import write_host

pytestmark = pytest.mark.sandbox


class LateSshd:
    """A TCP port that refuses connections until ``up`` is set, then forwards each to the sandbox sshd: a host
    whose sshd is still starting when the run begins. The test sets ``up`` once the tool has seen the refusal,
    so the order does not depend on how fast the tool starts."""

    def __init__(self, target_port: int) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.target_port = target_port
        self.accepted = 0
        self.up = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self.up.wait(0.05):
            if self._stop.is_set():
                return
        with socket.socket() as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(8)
            listener.settimeout(0.2)
            while not self._stop.is_set():
                try:
                    client, _ = listener.accept()
                except socket.timeout:
                    continue
                self.accepted += 1
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def test_a_late_sshd_is_retried_once_and_an_auth_failure_is_not(sandbox, wheel_env, tmp_path: Path) -> None:
    base = sandbox.base
    late = LateSshd(base.port)
    try:
        known = tmp_path / "known_hosts"  # the sandbox key, also under the late port
        entries = Path(base.known_hosts).read_text().splitlines()
        key = next(ln.split(" ", 1)[1] for ln in entries if ln.startswith(f"[127.0.0.1]:{base.port} "))
        known.write_text("\n".join([*entries, f"[127.0.0.1]:{late.port} {key}"]) + "\n")
        stranger = tmp_path / "not-authorized"  # a key the sandbox sshd does not know
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True, timeout=30)
        inv = tmp_path / "inv"
        write_host(inv, base, name="late", port=late.port, known_hosts=str(known))
        write_host(inv, base, name="badkey", identity_file=str(stranger), ssh_agent=False)
        env = wheel_env.env(DDTREE_INVENTORY=str(inv), DDTREE_SNAPSHOTS=str(tmp_path / "store"), SSH_AUTH_SOCK="")
        out = (tmp_path / "stdout").open("w+")  # a file: a large JSON report must not fill a pipe nobody reads yet
        run = subprocess.Popen([str(wheel_env.script), "apply", "-H", "late,badkey", "--dry-run", "--json"],
                               cwd=wheel_env.workdir, env=env, stdout=out, stderr=subprocess.PIPE, text=True)
        stderr = []
        for line in run.stderr:  # sshd "comes up" once the first attempt was refused, within the retry's wait
            stderr.append(line)
            if "trying once more" in line:
                late.up.set()
        run.wait(timeout=600)
        out.seek(0)
        stdout = out.read()
        out.close()
    finally:
        late.close()
    proc = subprocess.CompletedProcess(run.args, run.returncode, stdout, "".join(stderr))
    result = json.loads(proc.stdout)
    reports = {r["host"]: r for r in result["hosts"]}
    assert set(reports) == {"late", "badkey"}, proc.stdout + proc.stderr
    assert reports["late"]["status"] == "dry-run" and late.accepted >= 1, (reports["late"], proc.stderr)
    retries = [ln for ln in proc.stderr.splitlines() if "trying once more" in ln]
    assert len(retries) == 1 and retries[0].startswith("late: host late: cannot connect"), proc.stderr
    assert reports["badkey"]["status"] == "unreachable" and "authentication" in reports["badkey"]["message"]
    assert result["exit_code"] == 3 and proc.returncode == 3
