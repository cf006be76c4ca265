#!/usr/bin/env python3
"""`make test`'s check that the documents promise what the repository does (after `make`), where a program
can tell. The documents: README.md, CONTRIBUTING.md and docs/*.md but the history of figures
(docs/PERFORMANCE-HISTORY.md, which records what was, and is checked for its links alone).

- files: every path of the repository that a command in a shell code block names exists, and a command run
  as a path (``scripts/gpu-check.sh``, ``examples-c/bench/train_step.py``) has its run bit; every path of the
  repository's sources that the text names exists; every ``build/`` path of "What `make` lays out" exists;
- links: every relative link of a document (and of the history) names a file that exists, and its
  ``#anchor``, a heading of that file; the README's documentation map links every file of docs/;
- lengths: README.md at most 300 lines, docs/PERFORMANCE.md at most 600;
- make: every ``make TARGET`` a document names is a target (``make help`` lists it, or, for a file, make has
  a rule for it), and ``make help`` lists every target the Makefile declares phony, each with a description;
- settings: one document has the settings table; every ``MSCCLPP_*`` name of the documents is a row of it, a
  macro of the headers, or a variable a script of the repository reads (the test runners'), or is said to be
  removed;
- the wheel: the tag the documents give (``cpXY-abi3``, "CPython X.Y or later") is the one of the package
  ``make`` installed into build/python-venv, and the one python/setup.py and _fastcall.c's Py_LIMITED_API give;
- link flags: a list of ``-l`` flags the documents give for the static library is the Makefile's LIBS_PRIVATE.

Prints a PASS or FAIL line per check and ends with "readme tests: N passed, N failed".
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Iterable, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
HISTORY = "docs/PERFORMANCE-HISTORY.md"
README_MAX_LINES = 300
PERFORMANCE_MAX_LINES = 600
# First components of the repository's own paths (a path starting elsewhere, `./app`, is the user's).
GENERATED = ("build", "target", ".toolchain")

passed = 0
failed = 0


def verdict(ok: bool, what: str, details: Iterable[str] = ()) -> None:
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS {what}")
    else:
        failed += 1
        print(f"FAIL {what}")
        for d in details:
            print(f"    {d}")


def top_level() -> Set[str]:
    return {p.name for p in ROOT.iterdir() if p.name != ".git"}


TOP = top_level() | set(GENERATED)


def ignored_by_git(rel: str) -> bool:
    """Whether git ignores the path (a build output); without git, whether it lies in a build folder."""
    try:
        r = subprocess.run(["git", "check-ignore", "-q", rel], cwd=ROOT, capture_output=True)
        if r.returncode in (0, 1):
            return r.returncode == 0
    except OSError:
        pass
    return rel.split("/")[0] in GENERATED


def expand_braces(path: str) -> List[str]:
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    out = []
    for alt in m.group(1).split(","):
        out += expand_braces(path[: m.start()] + alt + path[m.end():])
    return out


PATH_RE = re.compile(r"^(?:\$PWD/|\./)?([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.{},-]+)*/?)$")


def repo_path(token: str) -> Optional[str]:
    """The token as a path of the repository (relative), or None when it is not one."""
    token = token.strip("`'\",;:()")
    m = PATH_RE.match(token)
    if not m or "/" not in m.group(1):
        return None
    rel = m.group(1)
    if rel.split("/")[0] not in TOP:
        return None
    return rel


def code_blocks(text: str) -> List[Tuple[str, int, List[str]]]:
    """(language, first line number, lines) of every fenced block."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if m:
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            blocks.append((m.group(1), i + 2, lines[i + 1:j]))
            i = j
        i += 1
    return blocks


def prose(text: str) -> str:
    """The text without its fenced code blocks (each of their lines left empty, so that line numbers hold)."""
    out = []
    inside = False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            out.append("")
        else:
            out.append("" if inside else line)
    return "\n".join(out)


def spans(text: str) -> List[Tuple[int, str]]:
    """(line number, content) of every inline code span of the prose; a span may go on over a line break
    within its paragraph (read as a space, as Markdown does)."""
    out = []
    line = 1
    for para in re.split(r"(\n\s*\n)", prose(text)):
        for m in re.finditer(r"`([^`]+)`", para):
            out.append((line + para.count("\n", 0, m.start()), m.group(1).replace("\n", " ")))
        line += para.count("\n")
    return out


def shell_code(line: str) -> str:
    """A code block's line without its comment, but for a comment offering another command ("# or: ...")."""
    m = re.search(r"(?:^|\s)#\s*(.*)$", line)
    if not m:
        return line
    alternative = re.match(r"or:\s*(.*)$", m.group(1))
    return line[: m.start()] + (" ; " + alternative.group(1) if alternative else "")


def shell_words(line: str) -> List[str]:
    try:
        return shlex.split(line, comments=False, posix=True)
    except ValueError:
        return line.split()


def commands(line: str) -> List[List[str]]:
    """The simple commands of a shell line (see shell_code), each as its words, assignments (VAR=value)
    first."""
    out: List[List[str]] = []
    for part in re.split(r"&&|\|\||[;|]|\$\(|\)", shell_code(line)):
        words = shell_words(part)
        if words:
            out.append(words)
    return out


Doc = Tuple[str, str]  # (path relative to the repository, text)


def documents() -> List[Doc]:
    """The documents checked: README.md, CONTRIBUTING.md and docs/*.md but the history."""
    paths = ["README.md", "CONTRIBUTING.md"] + sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md") if str(p.relative_to(ROOT)) != HISTORY)
    return [(p, (ROOT / p).read_text()) for p in paths if (ROOT / p).is_file()]


def check_files(docs: List[Doc]) -> None:
    missing: List[str] = []
    not_executable: List[str] = []
    named = 0
    for name, text in docs:
        for lang, first, lines in code_blocks(text):
            if lang not in ("sh", "bash", "console", ""):
                continue
            for n, line in enumerate(lines, first):
                for words in commands(line):
                    # The command word: the first word after the assignments.
                    k = 0
                    while k < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[k]):
                        k += 1
                    for idx, word in enumerate(words):
                        candidates = [word.split("=", 1)[1]] if re.match(r"^[A-Za-z_]\w*=", word) else [word]
                        for cand in candidates:
                            rel = repo_path(cand)
                            if rel is None:
                                continue
                            for p in expand_braces(rel):
                                named += 1
                                path = ROOT / p
                                if not path.exists():
                                    missing.append(f"{name}:{n}: {p}")
                                elif idx == k and words[0] not in ("bash", "sh", "python", "python3") and \
                                        path.is_file() and not os.access(path, os.X_OK):
                                    not_executable.append(f"{name}:{n}: {p} (run as a command, no run bit)")
    verdict(not missing, f"the {named} repository paths that the code blocks' commands name exist", missing)
    verdict(not not_executable, "the scripts the code blocks run by their path have their run bit", not_executable)

    # Paths of the sources named in the text (in or out of backticks): they exist.
    prose_missing = []
    count = 0
    for name, text in docs:
        for n, line in enumerate(prose(text).splitlines(), 1):
            for m in re.finditer(r"(?<![\w./$-])((?:[a-z][a-z0-9_-]*|\.ci)/[A-Za-z0-9_./{},*<>-]*[A-Za-z0-9_/}])", line):
                token = m.group(1)
                if "<" in token or "*" in token:
                    continue  # a pattern (examples-c/<dir>/<name>.cu, alltoall_*), not a path
                rel = repo_path(token)
                if rel is None:
                    continue
                for p in expand_braces(rel):
                    if ignored_by_git(p):
                        continue  # a build output: see the layout check below
                    count += 1
                    if not (ROOT / p).exists():
                        prose_missing.append(f"{name}:{n}: {p}")
    verdict(not prose_missing, f"the {count} source paths the text names exist", prose_missing)

    # What `make` lays out (a table under that heading): every build/ path in it exists now.
    layout_missing = []
    outputs = []
    where = []
    for name, text in docs:
        table = re.search(r"What `make` lays out:?\n\n((?:\|.*\n)+)", text)
        if not table:
            continue
        where.append(name)
        for row in table.group(1).splitlines():
            first_cell = row.split("|")[1] if row.count("|") > 2 else ""
            for token in re.findall(r"`([^`]+)`", first_cell):
                if token.startswith("build/"):
                    outputs.append(token)
                    if not (ROOT / token).exists():
                        layout_missing.append(f"{name}: {token}")
    verdict(bool(outputs) and not layout_missing,
            f"the {len(outputs)} build/ paths of \"What `make` lays out\" ({', '.join(where) or 'nowhere'}) exist "
            "after make", layout_missing or ([] if outputs else ["no such table found"]))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> Set[str]:
    out: Set[str] = set()
    seen: dict = {}
    for line in prose(text).splitlines():
        m = re.match(r"^#{1,6} (.*?)\s*#*\s*$", line)
        if m:
            a = slug(m.group(1))
            k = seen.get(a, 0)
            out.add(a if k == 0 else f"{a}-{k}")
            seen[a] = k + 1
    return out


def check_links(docs: List[Doc]) -> None:
    checked = list(docs)
    if (ROOT / HISTORY).is_file():
        checked.append((HISTORY, (ROOT / HISTORY).read_text()))
    bad = []
    count = 0
    for name, text in checked:
        base = (ROOT / name).parent
        for n, line in enumerate(prose(text).splitlines(), 1):
            for m in re.finditer(r"\]\(([^)\s]+)\)", line):
                target = m.group(1)
                if re.match(r"^[a-z]+:", target):
                    continue  # https:, mailto:
                count += 1
                path, _, anchor = target.partition("#")
                file = (base / path).resolve() if path else ROOT / name
                if not file.exists():
                    bad.append(f"{name}:{n}: {target}: no such file")
                elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
                    bad.append(f"{name}:{n}: {target}: no heading of {file.relative_to(ROOT)} has that anchor")
    verdict(not bad, f"the {count} relative links of the documents name files and headings that exist", bad)

    readme = dict(docs).get("README.md", "")
    linked = {os.path.normpath(t.partition("#")[0]) for t in re.findall(r"\]\(([^)\s]+)\)", readme)}
    unmapped = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")
                      if str(p.relative_to(ROOT)) not in linked)
    verdict(not unmapped, "the README's documentation map links every file of docs/", unmapped)


def check_lengths() -> None:
    for rel, most in (("README.md", README_MAX_LINES), ("docs/PERFORMANCE.md", PERFORMANCE_MAX_LINES)):
        path = ROOT / rel
        n = len(path.read_text().splitlines()) if path.is_file() else 0
        verdict(0 < n <= most, f"{rel} has {n} lines (at most {most})")


def make_help() -> Tuple[Set[str], List[str]]:
    r = subprocess.run(["make", "--no-print-directory", "-s", "help"], cwd=ROOT, capture_output=True, text=True)
    targets: Set[str] = set()
    undescribed = []
    section = None
    for line in r.stdout.splitlines():
        if line.startswith("targets"):
            section = "t"
        elif line.startswith("variables"):
            section = "v"
        elif section == "t" and line.startswith("  "):
            parts = line.split(None, 1)
            targets.add(parts[0])
            if len(parts) < 2 or not parts[1].strip():
                undescribed.append(parts[0])
    return targets, undescribed


def phony_targets() -> Set[str]:
    names: Set[str] = set()
    for mk in [ROOT / "Makefile", *sorted(ROOT.glob("c-tests/**/*.mk"))]:
        text = mk.read_text().replace("\\\n", " ")
        for m in re.finditer(r"^\.PHONY:(.*)$", text, re.M):
            names.update(m.group(1).split())
    return names - {"FORCE"}


def check_make(docs: List[Doc]) -> None:
    targets, undescribed = make_help()
    phony = phony_targets()
    verdict(phony <= targets and not undescribed,
            f"make help lists every phony target of the Makefile ({len(phony)}), each with a description",
            [f"not listed: {t}" for t in sorted(phony - targets)] + [f"no description: {t}" for t in undescribed])
    verdict(targets <= phony, "every target make help lists is declared phony",
            [f"not .PHONY: {t}" for t in sorted(targets - phony)])

    # Commands: inline spans and code-block lines (without comments), cut at && ; | ( ).
    named: Set[str] = set()
    lines: List[str] = []
    for _, text in docs:
        lines += [span for _, span in spans(text)]
        for lang, _, block in code_blocks(text):
            if lang in ("sh", "bash", ""):
                lines += [shell_code(line) for line in block]
    for line in lines:
        for part in re.split(r"&&|\|\||[;|()]", line):
            words = shell_words(part)
            while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
                words = words[1:]
            if not words or words[0] != "make":
                continue
            named.update(w for w in words[1:] if "=" not in w and not w.startswith("-"))
    bad = []
    for t in sorted(named):
        if "/" in t:
            r = subprocess.run(["make", "--no-print-directory", "-n", t], cwd=ROOT, capture_output=True, text=True,
                               timeout=120)
            if r.returncode != 0:
                bad.append(f"{t}: {r.stderr.strip()[-200:]}")
        elif t not in targets:
            bad.append(f"{t}: not a target make help lists")
    verdict(not bad, f"the make targets the documents name exist ({', '.join(sorted(named))})", bad)


def check_settings(docs: List[Doc]) -> None:
    tables = {name: set(re.findall(r"^\| `(MSCCLPP_[A-Z0-9_]+)` \|", text, re.M)) for name, text in docs}
    holders = sorted(name for name, t in tables.items() if t)
    verdict(len(holders) == 1, f"one document has the settings table ({', '.join(holders) or 'none'})")
    table: Set[str] = set().union(*tables.values()) if tables else set()
    removed: Set[str] = set()
    names: Set[str] = set()
    for _, text in docs:
        for para in text.split("\n\n"):
            if re.search(r"\bremoved\b", para):
                # `MSCCLPP_X=value` there: a value removed, not the setting.
                removed.update(re.findall(r"(?<![A-Za-z0-9_])(MSCCLPP_[A-Z0-9_]*[A-Z0-9])\b(?!=)", para))
        # Not the build's own variables (LIBMSCCLPP_*, read by build.rs), which are no run-time settings.
        names |= set(re.findall(r"(?<![A-Za-z0-9_])MSCCLPP_[A-Z0-9_]*[A-Z0-9]", text))
    macros: Set[str] = set()
    for d in ("include", "kernels", "kernels/collectives", "build/include"):
        for f in (ROOT / d).glob("*.h*"):
            macros.update(re.findall(r"^\s*#\s*define\s+(MSCCLPP_[A-Z0-9_]+)", f.read_text(errors="replace"), re.M))
    # Variables the repository's scripts and tests read (the test runners' own: MSCCLPP_TEST_MIN_GPUS, ...).
    script_text = ""
    for pattern in ("scripts/*", "c-tests/*.sh", "c-tests/**/*.sh", "python/*.sh", "python/tests/*.py",
                    "examples-c/*.sh", "examples-c/bench/*", "c-tests/**/*.cpp", "c-tests/**/*.cu", "c-tests/**/*.h"):
        for f in ROOT.glob(pattern):
            if f.is_file() and f.name != "check-readme.py":
                script_text += f.read_text(errors="replace")
    unknown = []
    for name in sorted(names - table - removed):
        if name in macros:
            continue
        if re.search(rf"\b{name}\b", script_text):
            continue
        unknown.append(f"{name}: not in the settings table, not a header macro, read by no script")
    verdict(not unknown, f"every MSCCLPP_* name of the documents exists ({len(names)} names, {len(table)} settings)",
            unknown)
    back = sorted(removed & table)
    verdict(not back, "no setting said to be removed is still in the table", back)


def installed_wheel_tag() -> Optional[str]:
    for wheel in (ROOT / "build" / "python-venv").glob("lib/python3*/site-packages/mscclpp-*.dist-info/WHEEL"):
        for line in wheel.read_text().splitlines():
            if line.startswith("Tag: "):
                return line[5:].strip()
    return None


def check_wheel(docs: List[Doc]) -> None:
    text = "\n".join(t for _, t in docs)
    stated = sorted(set(re.findall(r"\b(cp3\d+)-abi3\b", text)))
    tag = installed_wheel_tag()
    setup = (ROOT / "python" / "setup.py").read_text()
    setup_tags = sorted(set(re.findall(r'return "(cp3\d+)", "abi3"', setup)))
    limited = re.search(r"#define Py_LIMITED_API 0x03([0-9A-Fa-f]{2})0000", (ROOT / "python/mscclpp/_fastcall.c").read_text())
    limited_tag = f"cp3{int(limited.group(1), 16)}" if limited else None
    verdict(len(stated) == 1, f"the documents give one stable-ABI wheel tag ({', '.join(stated) or 'none'})")
    if len(stated) != 1:
        return
    want = stated[0]
    verdict(setup_tags == [want] and limited_tag == want,
            f"python/setup.py tags the wheel {want}-abi3 and _fastcall.c builds against Py_LIMITED_API of the same "
            f"version", [f"setup.py: {setup_tags}", f"_fastcall.c: {limited_tag}"])
    minor = int(want[3:])
    verdict(re.search(rf"CPython 3\.{minor} or later", text) is not None and
            not re.search(rf"CPython 3\.(?!{minor}\b)\d+ or later", text),
            f"the documents' \"CPython 3.{minor} or later\" matches {want}")
    if tag is None:
        verdict(False, "the package make installed into build/python-venv has a WHEEL tag", ["run make first"])
    elif tag.startswith("py3-none"):
        verdict("py3-none" in text, f"make built {tag} (no C fast path here), which the documents name")
    else:
        verdict(tag.startswith(f"{want}-abi3-"), f"the wheel make built is tagged {tag}, as the documents say ({want}-abi3)")


def check_link_flags(docs: List[Doc]) -> None:
    mk = (ROOT / "Makefile").read_text()
    m = re.search(r"^LIBS_PRIVATE := (.*)$", mk, re.M)
    private = set(m.group(1).split()) if m else set()
    lists = [s for _, text in docs for _, s in spans(text) if re.fullmatch(r"(?:-l[\w+.-]+\s*){3,}", s.strip())]
    bad = [s for s in lists if set(s.split()) != private]
    verdict(bool(lists) and not bad,
            f"the static library's link flags in the documents are the Makefile's LIBS_PRIVATE ({' '.join(sorted(private))})",
            bad or ([] if lists else ["no document gives such a list"]))


def main() -> int:
    docs = documents()
    print(f"documents: {', '.join(name for name, _ in docs)}")
    check_files(docs)
    check_links(docs)
    check_lengths()
    check_make(docs)
    check_settings(docs)
    check_wheel(docs)
    check_link_flags(docs)
    print(f"readme tests: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
