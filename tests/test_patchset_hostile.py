"""Hostile and malformed patch sets are refused at load time, with exit 2 and a message naming file and field.

Static fixtures live in tests/patchsets/hostile-*; variants that need a symlink or a big file are made from the
sample in a temporary directory (never committed).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ddtree_deploy.errors import EXIT_USAGE, InputError
from ddtree_deploy.patchset import MAX_FILE_BYTES, load_patchset

PATCHSETS = Path(__file__).resolve().parent / "patchsets"


def refused(path: Path | str) -> str:
    with pytest.raises(InputError) as err:
        load_patchset(path)
    assert err.value.exit_code == EXIT_USAGE
    return str(err.value)


@pytest.fixture
def sample_copy(tmp_path: Path) -> Path:
    """A writable copy of the sample patch-set family; returns its sglang-0.5.23 directory."""
    shutil.copytree(PATCHSETS / "sample", tmp_path / "sample")
    return tmp_path / "sample" / "sglang-0.5.23"


def edit_yaml(ps_dir: Path, old: str, new: str) -> Path:
    yml = ps_dir / "patchset.yaml"
    text = yml.read_text()
    assert old in text
    yml.write_text(text.replace(old, new, 1))
    return yml


# -- patches that reach outside the package ------------------------------------------------------------------------------
def test_dotdot_path_is_refused() -> None:
    msg = refused(PATCHSETS / "hostile-dotdot" / "sglang-0.5.23")
    assert "0001-escape.patch" in msg and "sglang/../../../../tmp/ddtree-pwned.py" in msg and "leaves the sglang package" in msg
    assert not Path("/tmp/ddtree-pwned.py").exists()


def test_symlink_in_patch_is_refused() -> None:
    msg = refused(PATCHSETS / "hostile-symlink" / "sglang-0.5.23")
    assert "0001-symlink.patch" in msg and "sglang/srt/configs/passwd.py" in msg and "symlinks (mode 120000) are refused" in msg


def test_absolute_path_is_refused() -> None:
    msg = refused(PATCHSETS / "hostile-absolute" / "sglang-0.5.23")
    assert "0001-absolute.patch" in msg and "'/etc/ddtree-pwned.conf'" in msg


def test_series_entry_outside_the_directory_is_refused(sample_copy: Path, tmp_path: Path) -> None:
    msg = refused(PATCHSETS / "hostile-series" / "sglang-0.5.23")
    assert "field 'series[0]'" in msg and "inside the patch-set directory" in msg
    # a series entry that is a symlink to a patch elsewhere is refused as well
    outside = tmp_path / "elsewhere.patch"
    first = next(sample_copy.glob("0001-*.patch"))
    outside.write_bytes(first.read_bytes())
    first.unlink()
    first.symlink_to(outside)
    msg = refused(sample_copy)
    assert first.name in msg and "symlink" in msg


def test_git_internals_and_dist_info_are_outside_the_package(sample_copy: Path) -> None:
    patch = next(sample_copy.glob("0002-*.patch"))
    text = patch.read_text()
    patch.write_text(text.replace("sglang/srt/speculative/ddtree_sample_hook.py", "sglang/.git/hooks/post-checkout"))
    assert "sglang/.git/hooks/post-checkout" in refused(sample_copy)
    patch.write_text(text.replace("sglang/srt/speculative/ddtree_sample_hook.py", "sglang-0.5.23.dist-info/RECORD"))
    assert "leaves the sglang package" in refused(sample_copy)
    patch.write_text(text.replace("sglang/srt/speculative/ddtree_sample_hook.py", "sglang"))  # the package itself
    assert "'sglang' is not a plain file path inside the sglang package" in refused(sample_copy)


@pytest.mark.parametrize("header, what", [
    ("deleted file mode 100644", "deleting a file is refused"),
    ("new file mode 160000", "submodules (mode 160000) are refused"),
    ("new file mode 100600", "unsupported file mode 100600"),
])
def test_deletions_submodules_and_odd_modes_are_refused(sample_copy: Path, header: str, what: str) -> None:
    patch = next(sample_copy.glob("0002-*.patch"))
    patch.write_text(patch.read_text().replace("new file mode 100644", header, 1))
    assert what in refused(sample_copy)


def test_binary_and_rename_patches_are_refused(sample_copy: Path) -> None:
    patch = next(sample_copy.glob("0002-*.patch"))
    original = patch.read_text()
    patch.write_text(original + "diff --git a/sglang/x.bin b/sglang/x.bin\nnew file mode 100644\nGIT binary patch\nliteral 3\nKcmZ?l\n\n")
    assert "binary patches are refused" in refused(sample_copy)
    patch.write_text(original + "diff --git a/sglang/a.py b/sglang/b.py\nsimilarity index 100%\nrename from sglang/a.py\nrename to sglang/b.py\n")
    assert "renames and copies are refused" in refused(sample_copy)


# -- runtime files -------------------------------------------------------------------------------------------------------
def test_runtime_dest_outside_the_package_is_refused() -> None:
    msg = refused(PATCHSETS / "hostile-runtime" / "sglang-0.5.23")
    assert "field 'runtime.dest'" in msg and "leaves the sglang package" in msg


def test_runtime_source_outside_the_patch_set_folder_is_refused(sample_copy: Path) -> None:
    msg = refused(edit_yaml(sample_copy, "source: ../runtime", "source: ../../../../etc"))
    assert "field 'runtime.source'" in msg and "leaves" in msg


def test_runtime_symlinks_are_refused(sample_copy: Path) -> None:
    runtime = sample_copy.parent / "runtime"
    (runtime / "passwd.py").symlink_to("/etc/passwd")
    msg = refused(sample_copy)
    assert "passwd.py is a symlink: refused" in msg
    (runtime / "passwd.py").unlink()
    (runtime / "linked_dir").symlink_to("/etc", target_is_directory=True)
    assert "linked_dir is a symlink: refused" in refused(sample_copy)


def test_oversized_files_are_refused(sample_copy: Path) -> None:
    runtime = sample_copy.parent / "runtime"
    with open(runtime / "blob.py", "wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)
    msg = refused(sample_copy)
    assert "blob.py" in msg and f"{MAX_FILE_BYTES + 1} bytes, over the {MAX_FILE_BYTES}-byte limit" in msg
    os.unlink(runtime / "blob.py")
    patch = next(sample_copy.glob("0001-*.patch"))
    with open(patch, "ab") as fh:
        fh.write(b"\n" * (MAX_FILE_BYTES + 1))
    assert patch.name in refused(sample_copy)


def test_runtime_and_series_may_not_own_the_same_file(sample_copy: Path) -> None:
    (sample_copy.parent / "runtime" / "device_config.py").write_text("# vendored copy\n")
    msg = refused(edit_yaml(sample_copy, "dest: sglang/srt/speculative/ddtree_sample", "dest: sglang/srt/configs"))
    assert "field 'runtime.dest': sglang/srt/configs/device_config.py is both patched by the series and vendored" in msg


# -- schema: file and field named ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("old, new, needle", [
    ('version: "0.5.23"', "version: 0.5", "field 'base.version': expected a string, got 0.5"),
    ("name: sample", "name: Sample Set", "field 'name': expected a lower-case name"),
    ('torch: ">=2.9"', 'torch: "two point nine"', "field 'requires'"),
    ("description:", "descripton:", "unknown field 'descripton'"),
    ("series:\n", "serie:\n", "unknown field 'serie'"),
    ("sglang/srt/configs/device_config.py: ", "sglang/srt/configs/device_config.py: abc", "field 'base.files.sglang/srt/configs/device_config.py': expected a sha256"),
])
def test_schema_errors_name_the_file_and_field(sample_copy: Path, old: str, new: str, needle: str) -> None:
    yml = edit_yaml(sample_copy, old, new)
    msg = refused(sample_copy)
    assert msg.startswith(str(yml.resolve())) and needle in msg


def test_missing_base_hash_for_a_touched_file_is_refused(sample_copy: Path) -> None:
    yml = sample_copy / "patchset.yaml"
    lines = [ln for ln in yml.read_text().splitlines(keepends=True) if "device_config.py:" not in ln]
    yml.write_text("".join(lines))
    msg = refused(sample_copy)
    assert "field 'base.files': no sha256 for sglang/srt/configs/device_config.py" in msg and "0002-" in msg


def test_directory_name_must_match_base_version(sample_copy: Path) -> None:
    msg = refused(edit_yaml(sample_copy, 'version: "0.5.23"', 'version: "0.5.22"'))
    assert "does not match the directory name 'sglang-0.5.23'" in msg


def test_bad_yaml_and_missing_patch_name_the_file(sample_copy: Path) -> None:
    next(sample_copy.glob("0001-*.patch")).unlink()
    msg = refused(sample_copy)
    assert "field 'series[0]'" in msg and "does not exist" in msg
    (sample_copy / "patchset.yaml").write_text("name: [unclosed\n")
    assert "invalid YAML" in refused(sample_copy)


# -- hooks (SGLang's plugin framework) ------------------------------------------------------------------------------------
def test_a_plugin_dist_info_is_generated_never_patched(sample_copy: Path) -> None:
    patch = next(sample_copy.glob("0002-*.patch"))
    patch.write_text(patch.read_text().replace("sglang/srt/speculative/ddtree_sample_hook.py",
                                               "sample_sglang_plugin-0.1.0.dist-info/entry_points.txt"))
    assert "leaves the sglang package" in refused(sample_copy)


PLUGIN = """plugin:
  name: sample
  entry: sglang.srt.speculative.ddtree_sample:register
  hooks_file: sglang/srt/speculative/ddtree_sample/hooks.json
"""
HOOK = """hooks:
  - target: sglang.srt.configs.device_config.DeviceConfig.__init__
    type: after
    hook: sglang.srt.speculative.ddtree_sample:register
    sha256: {sha}
"""


@pytest.mark.parametrize("text, needle", [
    (HOOK.format(sha="ab" * 32), "the patch set has hooks but no plugin"),
    (PLUGIN, "a plugin without hooks registers nothing"),
    (PLUGIN + HOOK.format(sha="abc"), "field 'hooks[0].sha256': expected a sha256"),
    (PLUGIN + HOOK.format(sha="ab" * 32).replace("type: after", "type: instead"), "'instead' is not one of before"),
    (PLUGIN + HOOK.format(sha="ab" * 32).replace("ddtree_sample:register", "elsewhere:run"),
     "is not module:function of a vendored file (vendored: sglang/srt/speculative/ddtree_sample)"),
    (PLUGIN.replace("hooks.json", "__init__.py") + HOOK.format(sha="ab" * 32), "must be a .json file"),
    (PLUGIN.replace("sglang/srt/speculative/ddtree_sample/hooks.json", "hooks.json") + HOOK.format(sha="ab" * 32),
     "field 'plugin.hooks_file'"),
])
def test_hooks_and_their_plugin_are_checked_at_load(sample_copy: Path, text: str, needle: str) -> None:
    init = sample_copy.parent / "runtime" / "__init__.py"
    init.write_text(init.read_text() + "\n\ndef register():\n    pass\n")
    yml = sample_copy / "patchset.yaml"
    yml.write_text(yml.read_text() + text)
    assert needle in refused(sample_copy)
