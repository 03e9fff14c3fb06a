"""The documentation stays true to the repository: README.md and docs/*.md link only to files and
headings that exist, name only repository paths that exist, the README stays short and starts
with its two commands, and nothing in the repository points outside it for its documentation."""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
README_MAX_LINES = 200

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`([^`]+)`")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# a path that climbs out of its file's folder: it must still land inside the repository
PARENT_PATH = re.compile(r"(?<![\w.])((?:\.\./)+[\w][\w./-]*)")


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of ``path`` outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, markup and punctuation dropped (but
    hyphens and underscores), spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in ("L", "N"))
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[tuple[int, str]]:
    links = []
    for number, line in prose_lines(path):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                links.append((number, target))
    return links


def repository_files() -> list[Path]:
    """Tracked files and untracked ones git does not ignore; without git, every file but the
    usual build outputs."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "__pycache__", "build", "dist"}
        return [
            p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)
        ]
    names = [name for name in listed.decode().split("\0") if name]
    return [ROOT / name for name in names if (ROOT / name).is_file()]


def test_docs_exist():
    assert (ROOT / "README.md") in DOCS
    names = {path.name for path in DOCS}
    for doc in ("architecture", "api", "deployment", "security", "observability", "lifecycle"):
        assert f"{doc}.md" in names
    for doc in ("benchmarks", "contract", "development"):
        assert f"{doc}.md" in names


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path):
    broken = []
    for number, target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{path.name}:{number}: {target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{path.name}:{number}: {target}: no heading #{anchor} there")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_repository_paths_exist(path: Path):
    """A code span that names a path into the repository (its first part a top-level folder,
    such as `replica/api.py` or `deploy/kuberay/`) names one that exists."""
    top_level = {p.name for p in ROOT.iterdir() if p.is_dir()} - {".git", ".venv"}
    missing = []
    for number, line in prose_lines(path):
        for span in CODE_SPAN.findall(line):
            if not re.fullmatch(r"[\w.-]+(/[\w.-]+)+/?", span):
                continue
            if span.split("/")[0] in top_level and not (ROOT / span).exists():
                missing.append(f"{path.name}:{number}: `{span}` does not exist")
    assert not missing, "\n".join(missing)


def test_readme_is_short_and_starts_with_its_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    block = re.search(r"^```(?:bash|sh)?\n(.*?)^```", text, re.S | re.M)
    assert block is not None, "the README has no code block"
    commands = [
        line.split("#")[0].strip()
        for line in block.group(1).splitlines()
        if line.split("#")[0].strip()
    ]
    assert commands[:2] == ["scripts/demo.sh", "scripts/test.sh"]
    for command in commands[:2]:
        assert (ROOT / command).is_file()


def test_nothing_points_outside_the_repository_for_its_documentation():
    offending = []
    for path in repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        for number, line in enumerate(text.splitlines(), 1):
            for target in PARENT_PATH.findall(line):
                landed = (path.parent / target).resolve()
                if not landed.is_relative_to(ROOT):
                    offending.append(f"{path.relative_to(ROOT)}:{number}: {target}")
    assert not offending, "\n".join(offending)


def test_slug_follows_github():
    assert slug("On Kubernetes (KubeRay, the Prometheus Operator)") == (
        "on-kubernetes-kuberay-the-prometheus-operator"
    )
    assert slug("bench.pool_ops") == "benchpool_ops"
    assert slug("`session-router top`") == "session-router-top"
    assert slug("Stopping, draining, restarting") == "stopping-draining-restarting"


def test_the_architecture_names_every_file_of_the_code():
    """docs/architecture.md lists every file of the code, the benchmarks, the scripts and the
    tests' support (the README says so): a file added without its row fails here."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    tracked = subprocess.run(
        ["git", "ls-files", "replica", "router", "bench", "scripts", "protos", "tests/support"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    unnamed = [path for path in tracked if f"`{path}`" not in text]
    assert not unnamed, f"docs/architecture.md does not name: {unnamed}"
