"""Regenerate patches/ddtree/sglang-0.5.11/*.patch from a developer work tree (quilt-style refresh).

Usage: python bench/e2e/make_series.py WORKTREE            # 0001-0003 (the split below)
       python bench/e2e/make_series.py --layers WORKTREE   # 0004+ (LAYERS), each on top of the patches before it
WORKTREE is a directory laid out like site-packages holding the *final* patched files (sglang/...).
The base comes from the sglang 0.5.11 wheel (cache dir or --wheel). Each patch of the series is a git commit
in a scratch repository; the split of files (and of dflash_worker.py hunks) between the first three patches is
fixed below. Later patches are layers: the scratch repository gets the base plus every patch already in the
patch set before the layer (applied with `git apply`), then the layer's files from WORKTREE, and the layer patch
is that commit. So a layer may touch files of earlier patches (its hunks are only its own changes).
"""
from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PSET = REPO / "patches" / "ddtree" / "sglang-0.5.11"
WORKER = "sglang/srt/speculative/dflash_worker.py"
VERIFY = "sglang/srt/speculative/ddtree_verify.py"

SERIES = [
    ("0001-dispatch.patch", "DDTree dispatch: --speculative-ddtree-budget under DFLASH, validation, verify width",
     ["sglang/srt/server_args.py", (WORKER, "dispatch")]),
    ("0002-tree-verify.patch", "DDTree tree verify in the V1 DFlash worker",
     [(WORKER, "rest"), "sglang/srt/speculative/dflash_info.py", (VERIFY, "torch")]),
    ("0003-mask-kernels.patch", "DDTree: Triton tree-mask kernel and CUDA-graph capture with the tree mask",
     [(VERIFY, "final"), "sglang/srt/model_executor/cuda_graph_runner.py"]),
]


# Layers on top of 0001-0003: (patch name, subject, files taken whole from the worktree).
LAYERS = [
    ("0004-hybrid-recurrent.patch",
     "DDTree on hybrid GatedDeltaNet targets: tree verify through the base's tree kernels, node-state commit",
     ["sglang/srt/layers/attention/hybrid_linear_attn_backend.py",
      "sglang/srt/model_executor/model_runner_kv_cache_mixin.py",
      WORKER, "sglang/srt/speculative/dflash_info.py", "sglang/srt/speculative/ddtree_hybrid.py"]),
]


def git(cwd, *args, input=None):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, input=input).stdout


def worker_dispatch_only(base: str, final: str, tmp: Path) -> str:
    """dflash_worker.py with only the __init__ hunks (the ones before _prepare_for_speculative_decoding)."""
    a, b = tmp / "a.py", tmp / "b.py"
    a.write_text(base)
    b.write_text(final)
    diff = subprocess.run(["diff", "-u", str(a), str(b)], capture_output=True, text=True).stdout
    head, *hunks = re.split(r"(?m)^(?=@@ )", diff)
    cut = base.index("    def _prepare_for_speculative_decoding(")
    cut_line = base[:cut].count("\n") + 1
    keep = [h for h in hunks if int(re.match(r"@@ -(\d+)", h).group(1)) < cut_line]
    p = tmp / "part.diff"
    p.write_text(head + "".join(keep))
    subprocess.run(["patch", "-s", str(a), str(p)], check=True)
    return a.read_text()


def verify_torch_only(final: str) -> str:
    """ddtree_verify.py before the Triton kernel: the mask builder uses the torch expansion."""
    start = final.index("_EXPAND_KERNEL = None")
    end = final.index("def sample_target_tokens_per_node(")
    simple = '''def build_ddtree_verify_mask(
    tree_mask: torch.Tensor,
    prefix_lens: torch.Tensor,
    prefix_lens_sum: int,
    max_prefix_len: Optional[int] = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Flattened triton-backend verify mask (vectorised torch; no host loop)."""
    return expand_tree_mask_torch(tree_mask, prefix_lens, prefix_lens_sum)


'''
    return final[:start] + simple + final[end:]


def stable_patch(repo: Path) -> str:
    """HEAD as a format-patch without the commit hash / date lines (no churn between refreshes)."""
    patch = git(repo, "format-patch", "-1", "--stdout", "--no-signature", "--full-index", "HEAD")
    patch = re.sub(r"(?m)^From [0-9a-f]{40} .*\n", "", patch, count=1)
    return re.sub(r"(?m)^Date: .*\n", "", patch, count=1)


def make_layers(wt: Path, wheel: Path) -> int:
    """Write each LAYERS patch: base + the patch set's earlier patches, then the layer's files from `wt`."""
    import yaml

    series = yaml.safe_load((PSET / "patchset.yaml").read_text())["series"]
    zf = zipfile.ZipFile(wheel)
    with tempfile.TemporaryDirectory() as td:
        repo = Path(td) / "repo"
        repo.mkdir()
        git(repo, "init", "-q")
        git(repo, "config", "user.email", "ddtree@localhost")
        git(repo, "config", "user.name", "ddtree")
        for name, msg, files in LAYERS:
            earlier = series[: series.index(name)] if name in series else series
            touched = set(files)
            for p in earlier:
                touched |= set(re.findall(r"(?m)^diff --git a/(\S+) b/", (PSET / p).read_text()))
            for f in sorted(touched):
                if f in zf.namelist() and not (repo / f).exists():
                    (repo / f).parent.mkdir(parents=True, exist_ok=True)
                    (repo / f).write_bytes(zf.read(f))
            git(repo, "add", "-A")
            git(repo, "commit", "-qm", "base", "--allow-empty")
            for p in earlier:
                git(repo, "apply", "-p1", str(PSET / p))
            git(repo, "add", "-A")
            git(repo, "commit", "-qm", "earlier patches", "--allow-empty")
            for f in files:
                (repo / f).parent.mkdir(parents=True, exist_ok=True)
                (repo / f).write_text((wt / f).read_text())
            git(repo, "add", "-A")
            git(repo, "commit", "-qm", msg)
            (PSET / name).write_text(stable_patch(repo))
            print("wrote", name)
            for f in files:
                if f in zf.namelist():
                    print(f"    {f}: {hashlib.sha256(zf.read(f)).hexdigest()}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("worktree", type=Path)
    ap.add_argument("--layers", action="store_true", help="write the LAYERS patches (0004+) instead of 0001-0003")
    ap.add_argument("--wheel", type=Path,
                    default=Path.home() / ".cache/ddtree-deploy/wheels/sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl")
    args = ap.parse_args()
    wt = args.worktree.resolve()
    if args.layers:
        return make_layers(wt, args.wheel)
    files = sorted({f if isinstance(f, str) else f[0] for _, _, fs in SERIES for f in fs})
    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        repo = td / "repo"
        repo.mkdir()
        zf = zipfile.ZipFile(args.wheel)
        base = {}
        for f in files:
            try:
                base[f] = zf.read(f).decode()
            except KeyError:
                base[f] = None  # new file
        git(repo, "init", "-q")
        git(repo, "config", "user.email", "ddtree@localhost")
        git(repo, "config", "user.name", "ddtree")
        for f, text in base.items():
            if text is not None:
                (repo / f).parent.mkdir(parents=True, exist_ok=True)
                (repo / f).write_text(text)
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "base sglang 0.5.11")
        final = {f: (wt / f).read_text() for f in files}
        for name, msg, fs in SERIES:
            for f in fs:
                path, mode = (f, "final") if isinstance(f, str) else f
                if path == WORKER and mode == "dispatch":
                    text = worker_dispatch_only(base[path], final[path], td)
                elif path == VERIFY and mode == "torch":
                    text = verify_torch_only(final[path])
                else:
                    text = final[path]
                (repo / path).parent.mkdir(parents=True, exist_ok=True)
                (repo / path).write_text(text)
            git(repo, "add", "-A")
            git(repo, "commit", "-qm", msg)
            (PSET / name).write_text(stable_patch(repo))
            print("wrote", name)
        shas = {f: hashlib.sha256(base[f].encode()).hexdigest() for f in files if base[f] is not None}
        for f, h in shas.items():
            print(f"    {f}: {h}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
