# Host facts, gathered on the host by its own Python (stdlib only, Python >= 3.8). The package manifest is
# remote/manifest.py (which imports this module for the facts of its `snapshot` op).
#
# ops:
#   facts(site_packages, package, release_root, torch_timeout, refresh)
#       everything that decides binary compatibility: interpreter and ABI tag, glibc, torch build (imported in a
#       subprocess with a timeout, so a broken torch cannot hang or kill us), driver and GPUs (nvidia-smi), the
#       versions and torch pins of the packages SGLang runs with, and the compiled .so files inside the package.
# Missing pieces (no torch, no nvidia-smi, no GPU) are facts with a status, never failures.
import glob
import json
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import time

from ._frame import Failure, _read_json, _stat_key, _write_cache

TRACKED_DISTS = ("sglang", "sglang-kernel", "sgl-kernel", "flashinfer-python", "flashinfer", "flashinfer-cubin",
                 "triton", "transformers", "torch")
_SKIP_DIRS = ("__pycache__",)
_FACTS_CACHE_NAME = ".facts-cache.json"

_TORCH_PROBE = r"""
import json, sys
sys.path.append(sys.argv[1])
import torch
r = {"version": str(torch.__version__), "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
     "git_version": getattr(torch.version, "git_version", None), "file": torch.__file__}
try:
    r["cxx11_abi"] = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
except Exception:
    r["cxx11_abi"] = None
flags = ""
getter = getattr(torch._C, "_cuda_getArchFlags", None)
if getter is not None:
    try:
        flags = getter() or ""
    except Exception:
        flags = ""
r["arch_list"] = [a for a in flags.replace(";", " ").split() if a]
r["compiled_with_cuda"] = getter is not None
sys.stdout.write("@@TORCH@@" + json.dumps(r) + "\n")
"""


def _norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


# -- interpreter, platform ----------------------------------------------------------------------------------------
def _python_facts():
    impl = sys.implementation.name
    short = {"cpython": "cp", "pypy": "pp"}.get(impl, impl[:2])
    return {
        "version": platform.python_version(),
        "implementation": impl,
        "abi_tag": "%s%d%d" % (short, sys.version_info[0], sys.version_info[1]),
        "soabi": sysconfig.get_config_var("SOABI"),
        "executable": sys.executable,
        "platform": sysconfig.get_platform(),
        "machine": platform.machine(),
    }


def _glibc():
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
    except (AttributeError, ValueError, OSError):
        text = None
    if text and text.startswith("glibc "):
        return text.split()[1]
    lib, ver = platform.libc_ver()
    return ver if lib == "glibc" and ver else None


# -- installed distributions --------------------------------------------------------------------------------------
def _requirement_name(line):
    """The distribution a Requires-Dist value is about (PEP 508's name, its first token). The rest of the line
    (extras, specifier, markers) is read on the control side with packaging.requirements, which a host's Python
    may not have: this module is stdlib only."""
    m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
    return _norm(m.group(1)) if m else None


def _dists(site_packages):
    """Installed distributions we care about, first match on [site_packages] + sys.path wins (as import would).

    Looked up by name (a directory-name match per path entry) rather than by parsing every installed METADATA."""
    from importlib import metadata

    path = [site_packages] + [p for p in sys.path if p != site_packages]
    found = {}
    for name in TRACKED_DISTS:
        found[name] = None
        for dist in metadata.distributions(name=name, path=path):
            requires = [line for line in dist.requires or [] if _requirement_name(line) in TRACKED_DISTS]
            location = None
            try:
                location = str(dist.locate_file(""))
            except Exception:
                pass
            found[name] = {"version": dist.version, "requires": requires, "location": location}
            break
    return found


def _dist_info(site_packages, package):
    """The package's dist-info directory (newest if stale ones linger) and what its WHEEL file says."""
    found = sorted(glob.glob(os.path.join(site_packages, "%s-*.dist-info" % package.replace("-", "_"))),
                   key=lambda p: os.stat(p).st_mtime_ns)
    if not found:
        return None, [], {}
    chosen = found[-1]
    wheel = {"tags": [], "root_is_purelib": None, "generator": None}
    try:
        with open(os.path.join(chosen, "WHEEL")) as fh:
            for line in fh:
                key, _, value = line.partition(":")
                value = value.strip()
                if key == "Tag":
                    wheel["tags"].append(value)
                elif key == "Root-Is-Purelib":
                    wheel["root_is_purelib"] = value.lower() == "true"
                elif key == "Generator":
                    wheel["generator"] = value
    except OSError:
        pass
    return os.path.basename(chosen), [os.path.basename(p) for p in found], wheel


# -- compiled files ---------------------------------------------------------------------------------------------------
def _elf_info(path):
    """DT_NEEDED libraries and the newest GLIBC_x.y symbol version an ELF shared object asks for."""
    info = {"needed": [], "glibc_max": None, "elf": False}
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        info["error"] = str(exc)
        return info
    if data[:4] != b"\x7fELF" or data[4] != 2:  # ELF64 only (every CUDA host)
        return info
    info["elf"] = True
    end = "<" if data[5] == 1 else ">"
    try:
        shoff, = struct.unpack_from(end + "Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", data, 0x3A)
        sections = []
        for i in range(shnum):
            off = shoff + i * shentsize
            name, stype, _flags, _addr, offset, size, link = struct.unpack_from(end + "IIQQQQI", data, off)
            sections.append((name, stype, offset, size, link))
        dynamic = [s for s in sections if s[1] == 6]  # SHT_DYNAMIC
        if dynamic:
            _n, _t, offset, size, link = dynamic[0]
            strtab = sections[link]
            strings = data[strtab[2]:strtab[2] + strtab[3]]
            for pos in range(offset, offset + size, 16):
                tag, val = struct.unpack_from(end + "qQ", data, pos)
                if tag == 0:
                    break
                if tag == 1:  # DT_NEEDED
                    info["needed"].append(strings[val:strings.index(b"\0", val)].decode(errors="replace"))
            versions = [tuple(int(x) for x in m.groups()) for m in re.finditer(rb"GLIBC_(\d+)\.(\d+)", strings)]
            if versions:
                info["glibc_max"] = "%d.%d" % max(versions)
    except (struct.error, IndexError, ValueError) as exc:
        info["error"] = "unreadable ELF: %s" % exc
    return info


def _compiled_files(site_packages, package, elf_cache, rel_paths=None):
    """Every .so inside the package with its linkage; ELF details cached by _stat_key in elf_cache."""
    if rel_paths is None:
        rel_paths = [rel for rel, _entry in _walk(site_packages, package)]
    found = []
    for rel in sorted(rel_paths):
        name = rel.rsplit("/", 1)[-1]
        if not (name.endswith(".so") or ".so." in name):
            continue
        full = os.path.join(site_packages, rel)
        try:
            st = os.stat(full)
        except OSError:
            continue
        key = _stat_key(st)
        old = elf_cache.get(rel)
        if old and old[:-1] == key:
            elf = old[-1]
        else:
            elf = _elf_info(full)
            elf_cache[rel] = key + [elf]
        needed = elf["needed"]
        found.append({
            "path": rel,
            "size": st.st_size,
            "needed": needed,
            "links_libtorch": any(n.startswith(("libtorch", "libc10")) for n in needed),
            "links_cuda": any(n.startswith(("libcudart", "libcuda.", "libcublas")) for n in needed),
            "glibc_max": elf["glibc_max"],
        })
    return found


# -- torch (subprocess, timeout, cached by the identity of its files) --------------------------------------------------
def _torch_identity():
    """Stat of the files that change whenever torch is reinstalled; None when torch is not importable."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except Exception:
        return None
    if spec is None or not spec.origin:
        return None
    tdir = os.path.dirname(spec.origin)
    parts = [os.path.realpath(sys.executable)]
    for p in [spec.origin, os.path.join(tdir, "version.py")] + sorted(glob.glob(os.path.join(tdir, "_C*.so"))):
        try:
            st = os.stat(p)
            parts.append([p] + _stat_key(st))
        except OSError:
            parts.append([p, None])
    return parts


def _start_torch_probe(site_packages):
    return subprocess.Popen([sys.executable, "-c", _TORCH_PROBE, site_packages], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd="/", start_new_session=True)


def _finish_torch_probe(proc, timeout, started):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except OSError:
            proc.kill()
        proc.communicate()
        return {"status": "timeout", "error": "import torch took longer than %gs" % timeout}
    text = out.decode(errors="replace")
    if "@@TORCH@@" not in text:
        tail = (err.decode(errors="replace") or text).strip().splitlines()[-6:]
        return {"status": "broken", "error": "import torch failed (exit %s): %s" % (proc.returncode, " | ".join(tail))}
    r = json.loads(text.split("@@TORCH@@", 1)[1].splitlines()[0])
    r["status"] = "ok"
    r["seconds"] = round(time.monotonic() - started, 3)
    return r


def _torch_facts(probe, identity, timeout, started):
    if identity is None:
        return {"status": "missing", "error": "torch is not importable by %s" % sys.executable}
    return _finish_torch_probe(probe, timeout, started)


def _split_version(version):
    if not version:
        return None, None
    release, _, local = version.partition("+")
    return release, (local or None)


# -- GPUs and driver ----------------------------------------------------------------------------------------------------
def _nvidia_smi():
    exe = shutil.which("nvidia-smi") or ("/usr/bin/nvidia-smi" if os.path.exists("/usr/bin/nvidia-smi") else None)
    return exe


def _start_gpu_probe():
    exe = _nvidia_smi()
    if exe is None:
        return None
    q = [exe, "--query-gpu=index,name,compute_cap,driver_version,memory.total", "--format=csv,noheader,nounits"]
    return (subprocess.Popen(q, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL),
            subprocess.Popen([exe], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL))


def _finish_gpu_probe(procs, timeout=20):
    if procs is None:
        return {"status": "absent", "driver": None, "cuda_max": None, "gpus": [],
                "error": "nvidia-smi not found (no NVIDIA driver on this host)"}
    query, plain = procs
    try:
        out, err = query.communicate(timeout=timeout)
        pout, _perr = plain.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return {"status": "error", "driver": None, "cuda_max": None, "gpus": [], "error": "nvidia-smi hung for %ss" % timeout}
    if query.returncode != 0:
        msg = (out.decode(errors="replace") + err.decode(errors="replace")).strip().splitlines()
        return {"status": "error", "driver": None, "cuda_max": None, "gpus": [],
                "error": "nvidia-smi exit %s: %s" % (query.returncode, " ".join(msg[-3:]))}
    gpus, driver = [], None
    for line in out.decode(errors="replace").splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 4:
            continue
        driver = cols[3]
        gpus.append({"index": int(cols[0]) if cols[0].isdigit() else cols[0], "name": cols[1],
                     "compute_cap": cols[2] if re.match(r"^\d+\.\d+$", cols[2]) else None,
                     "memory_mib": int(cols[4]) if len(cols) > 4 and cols[4].isdigit() else None})
    m = re.search(r"CUDA Version:\s*([0-9.]+)", pout.decode(errors="replace"))
    return {"status": "ok", "driver": driver, "cuda_max": m.group(1) if m else None, "gpus": gpus, "error": None}


# -- ops ------------------------------------------------------------------------------------------------------------
def facts(site_packages, package="sglang", release_root=None, torch_timeout=90.0, refresh=False, cached_only=False,
          so_paths=None):
    """The facts record. ``cached_only``: return None instead of importing torch when its facts are not cached
    (the caller then asks again in parallel with its transfer). ``so_paths``: the package's files, to skip a walk."""
    started = time.monotonic()
    if not os.path.isdir(os.path.join(site_packages, package)):
        raise Failure("%s is not installed in %s (no %s/ directory there)" % (package, site_packages, package), "missing")
    identity = _torch_identity()
    cache_path = os.path.join(release_root, _FACTS_CACHE_NAME) if release_root else None
    cached = (_read_json(cache_path) if cache_path else None) or {}
    probe = None
    torch = None
    if (not refresh and identity is not None and cached.get("identity") == identity
            and cached.get("torch", {}).get("status") == "ok"):
        torch = dict(cached["torch"], cached=True)
    elif identity is not None:
        if cached_only:
            return None
        probe = _start_torch_probe(site_packages)  # runs while we gather everything else
    gpu_procs = _start_gpu_probe()

    elf_cache = {} if refresh else dict(cached.get("compiled") or {})
    before = json.dumps(elf_cache, sort_keys=True)
    dist_info, all_dist_infos, wheel = _dist_info(site_packages, package)
    result = {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "python": _python_facts(),
        "glibc": _glibc(),
        "packages": _dists(site_packages),
        "sglang": {
            "package": package,
            "site_packages": site_packages,
            "dist_info": dist_info,
            "dist_infos_found": all_dist_infos,
            "wheel_tags": wheel.get("tags", []),
            "root_is_purelib": wheel.get("root_is_purelib"),
            "compiled": _compiled_files(site_packages, package, elf_cache, so_paths),
        },
    }
    result["gpu"] = _finish_gpu_probe(gpu_procs)
    dirty = json.dumps(elf_cache, sort_keys=True) != before
    if torch is None:
        torch = _torch_facts(probe, identity, torch_timeout, started)
        torch["cached"] = False
        dirty = dirty or torch.get("status") == "ok"
    if cache_path and dirty:
        keep = torch if torch.get("status") == "ok" else cached.get("torch")
        _write_cache(cache_path, {"identity": identity if torch.get("status") == "ok" else cached.get("identity"),
                                 "torch": keep, "compiled": elf_cache})
    dist_torch = (result["packages"].get("torch") or {}).get("version")
    torch.setdefault("version", dist_torch)
    torch["release"], torch["local"] = _split_version(torch.get("version"))
    torch.setdefault("cuda", None)
    torch.setdefault("cxx11_abi", None)
    torch.setdefault("arch_list", [])
    result["torch"] = torch
    pkg = result["packages"].get(_norm(package)) or {}
    result["sglang"]["version"] = pkg.get("version")
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def _walk(site_packages, top):
    """(relative path, entry) for every entry under site_packages/top; scandir keeps this at stat() speed."""
    stack = [(os.path.join(site_packages, top), top)]
    while stack:
        full_dir, rel_dir = stack.pop()
        with os.scandir(full_dir) as it:
            for entry in it:
                rel = rel_dir + "/" + entry.name
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in _SKIP_DIRS:
                        stack.append((entry.path, rel))
                else:
                    yield rel, entry


OPS = {"facts": facts}
