"""Paths resolved on the host and hostile inputs bounded (issue 26, items 3 and 6), through the installed console
script against the real sshd sandbox host (and a ``connection: local`` host where the host's own ``tar`` must lie).

The inputs are the fault suite's (bench/faults.py, "paths resolved on the host, and hostile inputs bounded"): a
release_root spelt to land inside the installed package, a host whose "python" floods stdout or answers malformed
replies, a host whose tar declares a member at 1.5 GB, and patch sets that carry what is not source. Each must end in
one clear error naming the host (or file) and the op, with the control side's memory bounded and the host unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from wheel_env import REPO, WheelEnv

sys.path.insert(0, str(REPO / "bench"))

from faults import (  # noqa: E402
    FAKE_TAR, FLOOD_RSS_MAX, HOST_ROOT, HOSTILE, PATCHSET_KINDS, PATH_SPELLINGS, REPLY_KINDS, TAR_DECLARED, TAR_KINDS,
    host_listing, hostile_patchset, hostile_python, nothing_stored, peak_rss_cli, root_spelling)

from ddtree_deploy.sandbox import make_local_host  # noqa: E402
from ddtree_deploy.transport import HostConnection  # noqa: E402

pytestmark = pytest.mark.sandbox


@pytest.fixture()
def hostile(sandbox, wheel_env: WheelEnv, tmp_path: Path):
    """A host file writer for the sandbox base host (its own inventory and store) and the host's hostile folder."""
    base = sandbox.base
    fs = sandbox.state.hosts[base.name].fs / Path(HOSTILE).relative_to(HOST_ROOT)
    shutil.rmtree(fs, ignore_errors=True)
    fs.mkdir(parents=True)
    inv, store = tmp_path / "hosts", tmp_path / "snapshots"
    env = {"DDTREE_INVENTORY": str(inv), "DDTREE_SNAPSHOTS": str(store)}

    def write(name: str, **changes: str) -> dict:
        doc = yaml.safe_load(Path(base.source).read_text())
        doc.update(name=name, **changes)
        inv.mkdir(exist_ok=True)
        (inv / f"{name}.yaml").write_text(yaml.safe_dump(doc))
        return doc

    def run(*args: str, **extra: str):
        return wheel_env.run(*args, timeout=300, **env, **extra)

    yield base, fs, write, run, env
    shutil.rmtree(fs, ignore_errors=True)


def _listing(host) -> str:
    with HostConnection(host) as conn:
        return host_listing(conn, f"{HOST_ROOT}/venv", HOSTILE)


@pytest.mark.parametrize("kind", PATH_SPELLINGS)
def test_release_root_that_resolves_into_the_package_is_refused(hostile, kind) -> None:
    base, _, write, run, _ = hostile
    write("paths", release_root=f"{HOSTILE}/good-root")
    took = run("snapshot", "paths")  # a fresh snapshot: `apply` then goes straight to the host
    assert took.returncode == 0, took.stderr
    root, links = root_spelling(kind, base.site_packages)
    with HostConnection(base) as conn:
        for link, target in links.items():
            conn.run(f"mkdir -p '{os.path.dirname(link)}' && ln -sfn '{target}' '{link}'")
    write("paths", release_root=root)
    before = _listing(base)

    check = run("hosts", "check", "--json", "paths")
    assert check.returncode == 2, check.stdout + check.stderr
    row = json.loads(check.stdout)[0]
    assert row["ok"] is False and repr(root) in row["error"]
    assert ("resolved on the host" in row["error"] or "symlink to" in row["error"]), row["error"]
    assert row["paths"]["release_root"] != root or links  # the host's own spelling is reported beside ours
    for args in (("snapshot", "paths"), ("apply", "--host", "paths")):
        proc = run(*args)
        said = " ".join(proc.stderr.split())  # one line: a long line may wrap
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert repr(root) in said and "nothing was written" in said, said
        assert "resolved on the host" in said or "symlink to" in said
        assert "Traceback" not in said
    assert _listing(base) == before  # nothing under the venv or the hostile folder changed


def _python(hostile, kind: str) -> str:
    base, fs, write, _, _ = hostile
    if kind in REPLY_KINDS:
        (fs / "reply").write_text("@@DDTREE-RESULT@@" + REPLY_KINDS[kind] + "\n")
    script = fs / f"python-{kind}"
    script.write_text(hostile_python(base.python, "flood" if kind == "flood" else "reply", f"{HOSTILE}/reply"))
    script.chmod(0o755)
    write(f"h-{kind}", python=f"{HOSTILE}/python-{kind}")
    return f"h-{kind}"


def test_a_host_that_floods_stdout_costs_bounded_memory(hostile, wheel_env: WheelEnv) -> None:
    name = _python(hostile, "flood")
    before = _listing(hostile[0])
    code, text, rss = peak_rss_cli([str(wheel_env.script), "hosts", "check", name], wheel_env.env(**hostile[4]))
    assert code == 3 and f"host {name}" in text and "hostinfo.check" in text, text
    assert "printed more than 16 MiB on stdout" in text and "internal error" not in text
    assert rss < FLOOD_RSS_MAX, f"peak RSS {rss / 2**20:.0f} MiB while the host printed 200 MiB"
    assert _listing(hostile[0]) == before


@pytest.mark.parametrize("kind", list(REPLY_KINDS))
def test_a_malformed_reply_is_a_clear_error(hostile, kind) -> None:
    name = _python(hostile, kind)
    run = hostile[3]
    for args, op in ((("hosts", "check", name), "hostinfo.check"), (("snapshot", name), "hostinfo.paths")):
        proc = run(*args)
        text = proc.stdout + proc.stderr
        assert proc.returncode in (1, 3), text
        assert f"host {name}: remote {op} failed: malformed reply" in text, text
        if kind == "huge":
            assert "over the 8 MiB cap" in text
        assert "internal error" not in text and "Traceback" not in text


@pytest.fixture(scope="module")
def local_host(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-local")
    return make_local_host(root / "box", root / "hosts", name="tarhost"), root


@pytest.mark.parametrize("kind", TAR_KINDS)
def test_a_tar_member_declared_huge_is_refused_from_its_header(local_host, wheel_env: WheelEnv, tmp_path, kind) -> None:
    host_file, root = local_host
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "tar").write_text(FAKE_TAR.format(python=sys.executable, kind=kind, size=TAR_DECLARED))
    (fake / "tar").chmod(0o755)
    store = tmp_path / "store"
    env = wheel_env.env(DDTREE_INVENTORY=str(host_file.parent), DDTREE_SNAPSHOTS=str(store),
                        PATH=f"{fake}:{os.environ['PATH']}")
    code, text, rss = peak_rss_cli([str(wheel_env.script), "snapshot", "tarhost"], env)
    assert code == 1 and "host tarhost: snapshot refused" in text and "refused from its header" in text, text
    assert str(TAR_DECLARED) in text and "Traceback" not in text
    assert rss < FLOOD_RSS_MAX, f"peak RSS {rss / 2**20:.0f} MiB for a member declared at 1.5 GiB"
    assert nothing_stored(store, "tarhost")


@pytest.mark.parametrize("kind", PATCHSET_KINDS)
def test_a_patch_set_carrying_what_is_not_source_is_refused(hostile, tmp_path, kind) -> None:
    base, _, write, run, _ = hostile
    write("pshost")
    secret = tmp_path / "secret.txt"
    secret.write_text("a file outside the patch set\n")
    ps = hostile_patchset(kind, REPO / "patches" / "ddtree" / "sglang-0.5.11", tmp_path / "ps", secret)
    word = "is a hard link" if kind == "runtime-hardlink" else "not a source file"
    before = _listing(base)
    for args in (("patchset", "show", str(ps)), ("apply", "--host", "pshost", "--patchset", str(ps))):
        proc = run(*args)
        said = " ".join(proc.stderr.split())
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert word in said and str(ps.parent) in said and "Traceback" not in said, said
    assert _listing(base) == before
