"""Hints that help (issue 25, item 7): every ``ddtree-deploy COMMAND --flag`` a message or hint of the package
names is a real command with that flag, and a flag a hint tells the user to add exists on some command; through
the installed console script, ``patchset show NAME`` of a many-base patch set does not suggest ``--snapshot``
(which ``patchset show`` does not have)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import typer.main

from ddtree_deploy.cli import app

PACKAGE = Path(__file__).resolve().parents[2] / "ddtree_deploy"
ROOT = typer.main.get_command(app)
#: where a command mention in a text ends: a closing backtick, a clause break, a parenthesis
_END = re.compile(r"`|;|\(|\)|, |\n")
#: flags of the SGLang server (server.ddtree_flags), not of this tool
FOREIGN = ("--speculative", "--model", "--port", "--host-ip", "--tp", "--mem-fraction")
#: a flag after one of these words in a hint is that tool's (``pip download --no-deps``)
OTHER_TOOL = re.compile(r"\b(pip|ssh|ssh-keyscan|ssh-add|git|python|systemctl|journalctl)\b[^`;]*$")


def _texts() -> list[tuple[str, int, str, bool]]:
    """Every string literal of the package (f-strings with their fields as X): file, line, text, is-a-hint."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "remote" in path.relative_to(PACKAGE).parts:  # the host-side programs print no CLI hints of ours
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        hints = {id(kw.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
                 for kw in node.keywords if kw.arg == "hint"}
        inner = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inner:
                text = node.value
            else:
                continue
            found.append((str(path.relative_to(PACKAGE)), node.lineno, text, id(node) in hints))
    return found


def _options(cmd) -> set[str]:
    names = {"-h", "--help"}
    for p in cmd.params:
        names.update(getattr(p, "opts", []), getattr(p, "secondary_opts", []))
    return names


def _all_options(cmd) -> set[str]:
    names = _options(cmd)
    for sub in getattr(cmd, "commands", {}).values():
        names |= _all_options(sub)
    return names


def _check_mention(words: list[str]) -> str | None:
    """``words`` after ``ddtree-deploy``: the commands they walk and each flag must exist; returns the problem."""
    cmd, path = ROOT, []
    for word in words:
        word = word.strip("`'\".,:")
        subs = getattr(cmd, "commands", None)
        if subs is not None and word in subs:
            cmd, path = subs[word], [*path, word]
            continue
        if subs is not None and "take" in subs:  # `snapshot HOST` is `snapshot take HOST`
            cmd, path = subs["take"], [*path, "take"]
        if word.startswith("-") and len(word) > 1:
            flag = word.split("=")[0]
            if flag not in _options(cmd):
                return f"`ddtree-deploy {' '.join(path)}` has no option {flag}"
    return None


def test_every_command_and_flag_a_message_names_exists() -> None:
    everywhere = _all_options(ROOT)
    problems, mentions = [], 0
    for file, line, text, is_hint in _texts():
        for match in re.finditer(r"ddtree-deploy ", text):
            words = _END.split(text[match.end():], maxsplit=1)[0].split()
            if words and not words[0].startswith("-") and words[0] not in ROOT.commands:
                continue  # prose about the tool ("ddtree-deploy reads its patch sets ...")
            mentions += 1
            problem = _check_mention(words)
            if problem:
                problems.append(f"{file}:{line}: {problem}: {text!r}")
        if is_hint and "ddtree-deploy " not in text:
            for found in re.finditer(r"(?<![\w-])--[a-z][a-z0-9-]*", text):
                flag = found.group()
                if OTHER_TOOL.search(text[:found.start()]):
                    continue
                if flag not in everywhere and not flag.startswith(FOREIGN):
                    problems.append(f"{file}:{line}: hint names {flag}, which no command has: {text!r}")
    assert mentions >= 30  # the walk really read the package's hints
    assert not problems, "\n".join(problems)


def test_the_walk_catches_a_flag_the_command_lacks() -> None:
    assert _check_mention(["patchset", "show", "ddtree", "--snapshot", "X"]) == (
        "`ddtree-deploy patchset show` has no option --snapshot")
    assert _check_mention(["patchset", "check", "ddtree", "--snapshot", "X"]) is None
    assert _check_mention(["snapshot", "HOST", "--refresh"]) is None


def test_patchset_show_of_a_many_base_set_suggests_no_flag_it_lacks(cli) -> None:
    show = cli("patchset", "show", "ddtree")
    assert show.returncode == 2 and "name one (e.g. ddtree/sglang-" in show.stderr, show.stderr
    assert "--snapshot" not in show.stderr and "--base" not in show.stderr
