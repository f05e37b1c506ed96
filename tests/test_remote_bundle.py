"""The remote package as a host gets it: stdlib only, Python 3.8 syntax, relative imports with no cycle; the zip
of the modules an op imports (deterministic, cached by content); the boot line running an op from it in a fresh
interpreter, leaving what follows the request on stdin to the op and nothing on the host's disk; the reply
protocol (``_frame.main``) in this process."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import select
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
import zlib
from pathlib import Path

import pytest

from ddtree_deploy.remote import RESULT_MARKER, _frame
from ddtree_deploy.transport import bundle

PUBLIC = ("facts", "hostinfo", "manifest", "probe", "release", "server")


def _reply(line: bytes) -> dict:
    assert line.startswith(RESULT_MARKER.encode()), line
    return json.loads(line[len(RESULT_MARKER):])


# -- the package ----------------------------------------------------------------------------------------------------------
def test_the_package_is_stdlib_only_python38_and_its_imports_have_no_cycle() -> None:
    src = bundle.sources()
    assert sorted(n for n in src.files if not n.startswith("_")) == list(PUBLIC)
    for name, data in src.files.items():
        tree = ast.parse(data, f"{name}.py", feature_version=(3, 8))  # what the oldest host Python accepts
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                tops = [node.module.split(".")[0]]
            else:
                continue
            assert set(tops) <= sys.stdlib_module_names, f"remote/{name}.py line {node.lineno}: {tops} is not stdlib"
    graph = bundle.imports(src)
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join(path + (name,))}"
        if name not in done:
            for dep in sorted(graph[name]):
                visit(dep, path + (name,))
            done.add(name)

    for name in graph:
        visit(name, ())
    assert graph["release"] >= {"_state", "_lease", "_build", "server"} and graph["_lease"] >= {"probe", "server"}


def test_each_op_ships_the_modules_it_imports_and_no_others() -> None:
    assert bundle.needs("hostinfo") == ["__init__", "_frame", "hostinfo"]
    assert bundle.needs("manifest") == ["__init__", "_frame", "facts", "manifest"]
    assert bundle.needs("release") == ["__init__", "_build", "_frame", "_lease", "_state", "probe", "release", "server"]
    for bad in ("_state", "nope"):
        with pytest.raises(ValueError, match=rf"no remote module named '{bad}' \(have: facts, hostinfo"):
            bundle.needs(bad)
    with zipfile.ZipFile(io.BytesIO(zlib.decompress(bundle.program("manifest")))) as zf:
        assert zf.namelist() == [f"{bundle.PACKAGE}/{n}.py" for n in bundle.needs("manifest")]
        assert zf.read(f"{bundle.PACKAGE}/facts.py") == (bundle.SOURCE_DIR / "facts.py").read_bytes()


def test_the_zip_is_the_same_bytes_for_the_same_sources_and_follows_an_edit(tmp_path: Path) -> None:
    copy = tmp_path / "remote"
    shutil.copytree(bundle.SOURCE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    src = bundle.sources(copy)
    assert src == bundle.sources()  # equal content, equal digest
    names = bundle.needs("server", src)
    first = bundle.zip_bytes(names, src)
    for i, path in enumerate(sorted(copy.iterdir())):
        os.utime(path, (1_000_000_000 + i, 1_000_000_000 + i))
        path.chmod(0o600)
    assert bundle.zip_bytes(names, bundle.sources(copy)) == first  # no timestamp, mode or order of ours in it
    assert bundle._packed("server", src) is bundle._packed("server", bundle.sources(copy))  # built once
    (copy / "server.py").write_bytes((copy / "server.py").read_bytes() + b"\n# edited\n")
    edited = bundle.sources(copy)
    assert edited.digest != src.digest
    with zipfile.ZipFile(io.BytesIO(zlib.decompress(bundle._packed("server", edited)))) as zf:
        assert zf.read(f"{bundle.PACKAGE}/server.py").endswith(b"# edited\n")


def test_an_import_from_outside_the_package_is_refused(tmp_path: Path) -> None:
    (tmp_path / "_frame.py").write_text("")
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "evil.py").write_text("def f():\n    from .. import errors\n")
    with pytest.raises(ValueError, match=r"remote/evil.py line 2: imports from outside the package"):
        bundle.needs("evil", bundle.sources(tmp_path))
    (tmp_path / "evil.py").write_text("from . import missing\n")
    with pytest.raises(ValueError, match=r"remote/evil.py imports missing, which the package does not have"):
        bundle.needs("evil", bundle.sources(tmp_path))


# -- the boot line, in a fresh interpreter -------------------------------------------------------------------------------
def _boot(tmp_path: Path, no_memfd: bool = False) -> subprocess.Popen[bytes]:
    code = ("import os\ndel os.memfd_create\n" if no_memfd else "") + bundle.BOOT
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd="/", env=env)


def _read_reply(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> dict:
    buf = b""
    deadline = time.monotonic() + timeout
    while RESULT_MARKER.encode() not in buf or not buf.rstrip(b" ").endswith(b"\n"):
        assert time.monotonic() < deadline, f"no reply: {buf!r}"
        if select.select([proc.stdout], [], [], 0.05)[0]:
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, f"ended without a reply: {buf!r} {proc.stderr.read()!r}"
            buf += chunk
    return _reply(buf[buf.index(RESULT_MARKER.encode()):].splitlines()[0])


@pytest.mark.parametrize("no_memfd", [False, True], ids=["memfd", "unlinked-temp-file"])
def test_a_session_op_runs_from_the_zip_reads_the_lines_after_the_request_and_leaves_no_file(
        tmp_path: Path, no_memfd: bool) -> None:
    root = tmp_path / "ddtree"
    proc = _boot(tmp_path, no_memfd)
    try:
        proc.stdin.write(bundle.framed_request("release", "hold", {"root": str(root), "owner": {"run_id": "run-1"}}))
        proc.stdin.flush()
        first = _read_reply(proc)
        assert first["ok"] and first["result"]["acquired"] and first["result"]["holder_pid"] == proc.pid
        assert json.loads((root / "lock").read_text())["run_id"] == "run-1"
        links = _fd_links(proc.pid)  # the zip it imports from: open, with no name on any disk
        if no_memfd:
            assert [ln for ln in links if ln.startswith(str(tmp_path / "tmp")) and ln.endswith(" (deleted)")]
        else:
            assert "/memfd:ddtree-remote (deleted)" in links
        assert os.listdir(tmp_path / "tmp") == []
        proc.stdin.write(b"hb\nrelease\n")  # the session's lines: left on stdin for the op by the boot line
        proc.stdin.flush()
        assert _read_reply(proc) == {"ok": True, "result": {"released": True}}
    finally:
        proc.stdin.close()
        proc.wait(20)
    assert proc.returncode == 0 and not (root / "lock").exists() and os.listdir(tmp_path / "tmp") == []


def _fd_links(pid: int) -> list[str]:
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return links


def test_a_streamed_op_reads_the_payload_after_the_request_and_a_crash_names_its_module(tmp_path: Path) -> None:
    site, root = tmp_path / "site-packages", tmp_path / "ddtree"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "version.py").write_text('__version__ = "0.5.0"\n')
    new = b'__version__ = "0.5.0+ddtree"\n'
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("sglang/version.py")
        info.size = len(new)
        tar.addfile(info, io.BytesIO(new))
    args = {"root": str(root), "staging": str(root / "staging" / "run-1"), "site_packages": str(site),
            "package": "sglang", "release_id": "r1", "meta": {"run_id": "run-1"},
            "files": [{"path": "sglang/version.py", "sha256": hashlib.sha256(new).hexdigest(), "mode": 0o644,
                       "action": "replace"}]}
    proc = _boot(tmp_path)
    out, err = proc.communicate(bundle.framed_request("release", "receive", args) + buf.getvalue(), 20)
    reply = _reply(out.strip())
    assert proc.returncode == 0 and reply["ok"], (reply, err)
    assert reply["result"]["id"] == "r1" and reply["result"]["link_mode"] == "hardlink"
    assert (root / "releases" / "r1" / "sglang" / "version.py").read_bytes() == new
    proc = _boot(tmp_path)
    out, _ = proc.communicate(bundle.framed_request("hostinfo", "check", {"site_packages": 7}), 20)
    reply = _reply(out.strip())
    assert reply["kind"] == "crash" and f"{bundle.PACKAGE}/hostinfo.py" in reply["error"]  # the traceback's file


# -- the reply protocol, in this process ------------------------------------------------------------------------------------
def _main(capsys: pytest.CaptureFixture[str], module: str, op: str, **args) -> dict:
    _frame.main(json.dumps({"module": module, "op": op, "args": args}).encode())
    return _reply(capsys.readouterr().out.strip().encode())


def test_the_reply_protocol(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert _main(capsys, "probe", "read_json", path=str(tmp_path / "none")) == {"ok": True, "result": None}
    got = _main(capsys, "release", "switch", root=str(tmp_path / "r"), release_id="nope")
    assert got == {"ok": False, "error": "no release nope on this host (have: none)", "kind": "missing"}
    assert _main(capsys, "release", "nope")["error"].startswith("unknown op 'nope' (have: cleanup,")
    assert _main(capsys, "nope", "x") == {"ok": False, "error": "no remote module 'nope'", "kind": "usage"}
    assert _main(capsys, "_state", "x")["kind"] == "usage"
    assert _main(capsys, "hostinfo", "check", bogus=1)["kind"] == "crash"
