# The installed package's manifest, read on the host by its own Python (stdlib only, Python >= 3.8).
#
# ops:
#   manifest(site_packages, package, release_root, refresh)
#       sha256, size and mode of every file of the installed package and of its dist-info directory. Hashes are
#       cached on the host in <release_root>/.manifest-cache.json keyed by (path, size, mtime_ns, inode, ctime_ns),
#       so an unchanged package is re-described by stat() alone. ctime is in the key because nothing can set it: an
#       in-place edit that keeps the size and puts the old mtime back (touch -d, rsync -t, tar) still changes it.
#   snapshot(site_packages, package, release_root, refresh)
#       manifest + facts in one process when torch's facts are cached on the host (else facts is None).
#   package_manifest(site_packages, package)
#       every file of the installed package with its hash, size, mode and mtime: proves it is never modified.
import os
import shutil
import stat
import time

from . import facts as _facts
from ._frame import Failure, _read_json, _sha256_file, _stat_key, _write_cache

_CACHE_NAME = ".manifest-cache.json"


def manifest(site_packages, package="sglang", release_root=None, refresh=False):
    started = time.monotonic()
    if not os.path.isdir(os.path.join(site_packages, package)):
        raise Failure("%s is not installed in %s (no %s/ directory there)" % (package, site_packages, package), "missing")
    dist_info, _all, _wheel = _facts._dist_info(site_packages, package)
    tops = [package] + ([dist_info] if dist_info else [])
    cache_path = os.path.join(release_root, _CACHE_NAME) if release_root else None
    cache = None if (refresh or not cache_path) else _read_json(cache_path)
    entries = cache.get("entries", {}) if isinstance(cache, dict) and cache.get("site_packages") == site_packages else {}
    files, links, todo, new_entries = {}, {}, [], {}
    for top in tops:
        for rel, entry in _facts._walk(site_packages, top):
            full = entry.path
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                links[rel] = os.readlink(full)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            key = _stat_key(st)
            old = entries.get(rel)
            mode = stat.S_IMODE(st.st_mode)
            if old and old[:-1] == key:
                files[rel] = [old[-1], st.st_size, mode]
                new_entries[rel] = old
            else:
                todo.append((rel, full, key, mode))
    if todo:
        from concurrent.futures import ThreadPoolExecutor  # hashlib releases the GIL on large buffers

        workers = max(1, min(8, os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            digests = list(pool.map(lambda item: _sha256_file(item[1]), todo))
        for (rel, _full, key, mode), digest in zip(todo, digests):  # noqa: B905 (runs on Python 3.8)
            files[rel] = [digest, key[0], mode]
            new_entries[rel] = key + [digest]
    cache_written = False
    if cache_path and (todo or len(new_entries) != len(entries)):
        cache_written = _write_cache(cache_path, {"site_packages": site_packages, "entries": new_entries})
    return {"site_packages": site_packages, "package": package, "dist_info": dist_info, "files": files,
            "links": links, "zstd": shutil.which("zstd") is not None, "hashed": len(todo), "cached": len(files) - len(todo), "cache_written": cache_written,
            "seconds": round(time.monotonic() - started, 3)}


def snapshot(site_packages, package="sglang", release_root=None, refresh=False):
    """Manifest and (when torch's facts are cached on the host) facts in one process: the re-snapshot fast path."""
    m = manifest(site_packages, package, release_root, refresh)
    f = _facts.facts(site_packages, package, release_root, refresh=refresh, cached_only=True,
              so_paths=[p for p in m["files"] if p.startswith(package + "/")])
    return {"manifest": m, "facts": f}


def package_manifest(site_packages, package):
    """sha256, size and mode of every file of the installed package: proves it is never modified."""
    base = os.path.join(site_packages, package)
    out = {}
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            out[os.path.relpath(path, site_packages)] = [_sha256_file(path) if stat.S_ISREG(st.st_mode) else "link",
                                                        st.st_size, st.st_mode, int(st.st_mtime)]
    return out


OPS = {"manifest": manifest, "snapshot": snapshot, "package_manifest": package_manifest}
