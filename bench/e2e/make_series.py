"""Regenerate patches/ddtree/sglang-0.5.11/*.patch from a developer work tree (quilt-style refresh).

Usage: python bench/e2e/make_series.py WORKTREE
WORKTREE is a directory laid out like site-packages holding the *final* patched files (sglang/...).
The base comes from the sglang 0.5.11 wheel (cache dir or --wheel). Each patch of the series is a git commit
in a scratch repository; the split of files (and of dflash_worker.py hunks) between patches is fixed below.
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("worktree", type=Path)
    ap.add_argument("--wheel", type=Path,
                    default=Path.home() / ".cache/ddtree-deploy/wheels/sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl")
    args = ap.parse_args()
    wt = args.worktree.resolve()
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
            patch = git(repo, "format-patch", "-1", "--stdout", "--no-signature", "--full-index", "HEAD")
            # A stable header (no commit hash / date churn between refreshes).
            patch = re.sub(r"(?m)^From [0-9a-f]{40} .*\n", "", patch, count=1)
            patch = re.sub(r"(?m)^Date: .*\n", "", patch, count=1)
            (PSET / name).write_text(patch)
            print("wrote", name)
        shas = {f: hashlib.sha256(base[f].encode()).hexdigest() for f in files if base[f] is not None}
        for f, h in shas.items():
            print(f"    {f}: {h}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
