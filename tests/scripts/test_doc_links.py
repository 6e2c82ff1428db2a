#!/usr/bin/env python3
"""Tests of the documentation (CTest: scripts.doc_links, label cpu): every relative link in
README.md, docs/**/*.md and tests/README.md resolves to a file or folder of the repository, and
its #anchor to a heading of the target (GitHub's slugs); README.md stays a front door (at most
300 lines, no CLI-table row over 250 characters); every subcommand of src/cli/commands.cpp has a
row in README's CLI table and a `linac NAME` heading in docs/cli.md; every config key that src/
reads from a config (through JsonReader) is named in docs/config.md, and every LINAC_* variable the
C++ code names in docs/cli.md; and nothing under src/, kernels/, tests/, scripts/, docs/, configs/
or README.md refers to a path outside the repository. Standard library only; needs no build.

  python3 tests/scripts/test_doc_links.py [-v] [unittest options]
"""
import os
import re
import sys
import tempfile
import unicodedata
import unittest

sys.dont_write_bytecode = True

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

README_MAX_LINES = 300
CLI_ROW_MAX_CHARS = 250
# Paths outside the repository that files must not cite (spelled in pieces so that this file
# does not match itself).
OUTSIDE_PATHS = ["../" + "shared", "shared" + "/specs", "shared" + "/papers"]
OUTSIDE_SCAN = ["src", "kernels", "tests", "scripts", "docs", "configs", "README.md"]

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target); the text may hold one level of brackets
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^()\s]+(?:\([^()\s]*\))?[^()\s]*)(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"<a\s+(?:[^>]*\s)?(?:id|name)=\"([^\"]+)\"")


def doc_files(root):
    """README.md, docs/**/*.md and tests/README.md (those that exist), relative to ROOT."""
    files = [f for f in ("README.md", os.path.join("tests", "README.md")) if os.path.isfile(os.path.join(root, f))]
    for d, _, names in os.walk(os.path.join(root, "docs")):
        files += [os.path.relpath(os.path.join(d, n), root) for n in sorted(names) if n.endswith(".md")]
    return sorted(files)


def prose_lines(text, blank_code=True):
    """(line number, line) outside fenced code blocks, with inline code spans blanked (unless
    BLANK_CODE is false: a heading's code is part of its anchor)."""
    out, fenced = [], None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fenced is None:
                fenced = m.group(1)
            elif m.group(1) == fenced:
                fenced = None
            continue
        if fenced is None:
            out.append((n, INLINE_CODE.sub(lambda c: " " * len(c.group(0)), line) if blank_code else line))
    return out


def slug(heading):
    """GitHub's anchor for a heading: lowercase, markup and punctuation other than '-' and '_'
    dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.strip().lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LMN" or cat == "Pc":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path):
    """Every anchor of a Markdown file: its headings' slugs (repeats numbered -1, -2, ... as
    GitHub does) and explicit <a id=...> / <a name=...>."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    seen, found = {}, set()
    for _, line in prose_lines(text, blank_code=False):
        m = HEADING.match(line)
        if m:
            s = slug(m.group(2))
            k = seen.get(s, 0)
            seen[s] = k + 1
            found.add(s if k == 0 else f"{s}-{k}")
        found.update(HTML_ID.findall(line))
    return found


def links(text):
    """(line number, target) of every inline link, image and reference definition."""
    out = []
    for n, line in prose_lines(text):
        for m in INLINE_LINK.finditer(line):
            out.append((n, m.group(1).strip("<>")))
        m = REF_DEF.match(line)
        if m:
            out.append((n, m.group(1).strip("<>")))
    return out


def is_external(target):
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) is not None  # http:, https:, mailto:, ...


def broken_links(root, files):
    """'FILE:LINE: TARGET: reason' for every relative link of FILES (relative to ROOT) whose
    file or anchor does not exist."""
    root = os.path.realpath(root)
    problems, anchor_cache = [], {}
    for rel in files:
        src = os.path.join(root, rel)
        with open(src, encoding="utf-8") as f:
            text = f.read()
        for n, target in links(text):
            if is_external(target):
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.realpath(os.path.join(os.path.dirname(src), path)) if path else src
            where = f"{rel}:{n}: {target}"
            if os.path.commonpath([root, dest]) != root:
                problems.append(f"{where}: points outside the repository")
                continue
            if not os.path.exists(dest):
                problems.append(f"{where}: {os.path.relpath(dest, root)} does not exist")
                continue
            if anchor:
                if not dest.endswith(".md") or os.path.isdir(dest):
                    problems.append(f"{where}: an anchor into a file that is not Markdown")
                    continue
                if dest not in anchor_cache:
                    anchor_cache[dest] = anchors(dest)
                if anchor not in anchor_cache[dest]:
                    problems.append(f"{where}: no heading '#{anchor}' in {os.path.relpath(dest, root)}")
    return problems


def cli_rows(readme_text):
    """The rows of the table in README's '## CLI' section (header and separator excluded)."""
    rows, inside = [], False
    for line in readme_text.splitlines():
        if line.startswith("## "):
            inside = line.strip() == "## CLI"
            continue
        if inside and line.startswith("|") and not re.match(r"^\|[\s:|-]+\|?\s*$", line):
            rows.append(line)
    return rows[1:] if rows else rows  # the first row is the header


# A row of src/cli/commands.cpp's table: {"name", "one-line summary", handler...}
COMMAND_ENTRY = re.compile(r'^\s*\{"([a-z][a-z-]*)",\s*"', re.M)


def subcommands(commands_cpp_text):
    """The subcommand names of the CLI's command table, in its order."""
    return COMMAND_ENTRY.findall(commands_cpp_text)


def undocumented_commands(names, readme_text, cli_md_text):
    """'NAME: WHAT' for each subcommand without a README CLI row or a docs/cli.md heading."""
    rows = cli_rows(readme_text)
    headings = {m.group(2) for m in map(HEADING.match, cli_md_text.splitlines()) if m}
    missing = []
    for name in names:
        if not any(re.match(r"^\|\s*`linac %s(`|\s)" % re.escape(name), r) for r in rows):
            missing.append(f"{name}: no row in README.md's CLI table")
        if f"`linac {name}`" not in headings:
            missing.append(f"{name}: no '## `linac {name}`' heading in docs/cli.md")
    return missing


# A key read from a config through JsonReader: r.get_int("heads", ...), m.child("train"), ...
CONFIG_READ = re.compile(r'\.(?:get_[a-z_]+|require_[a-z_]+|child|present|object_list)\("([a-z][a-z_0-9]*)"')


# What reads other JSON with the same reader: the command-line options (docs/cli.md) and a
# Hugging Face folder's config.json (docs/huggingface.md).
NOT_CONFIG_DIRS = {os.path.join("src", "cli"), os.path.join("src", "export")}


def first_matches(root, tops, suffixes, pattern, skip_dirs=()):
    """{match: first 'PATH:LINE' where PATTERN's group 1 matches} over the files under ROOT/TOPS
    whose names end in SUFFIXES, folders in SKIP_DIRS (relative to ROOT) left out."""
    found = {}
    for top in tops:
        for d, dirs, names in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if os.path.relpath(os.path.join(d, x), root) not in skip_dirs)
            for name in sorted(n for n in names if n.endswith(suffixes)):
                path = os.path.join(d, name)
                with open(path, encoding="utf-8") as f:
                    for n, line in enumerate(f, 1):
                        for m in pattern.findall(line):
                            found.setdefault(m, f"{os.path.relpath(path, root)}:{n}")
    return found


def config_keys(root):
    """{key: first 'PATH:LINE' that reads it} over the C++ sources under ROOT/src that read
    linac's configs (NOT_CONFIG_DIRS left out)."""
    return first_matches(root, ["src"], (".cpp",), CONFIG_READ, NOT_CONFIG_DIRS)


def undocumented_keys(keys, config_md_text):
    """'KEY (read at PATH:LINE)' for each key docs/config.md never names, as `key`, `a.key`,
    `key=...` or a JSON "key"."""
    missing = []
    for key, where in sorted(keys.items()):
        named = re.compile(r'`(?:[a-z_0-9]+\.)*%s(?:`|[ =.\[])|"%s"' % (re.escape(key), re.escape(key)))
        if not named.search(config_md_text):
            missing.append(f"{key} (read at {where})")
    return missing


ENV_NAME = re.compile(r'"(LINAC_[A-Z0-9_]+)"')
CXX_TOPS = ["src", "kernels", "base"]


def env_variables(root):
    """{LINAC_* name: first 'PATH:LINE' that names it as a string} over the C++ code."""
    return first_matches(root, CXX_TOPS, (".cpp", ".h", ".cu", ".cuh"), ENV_NAME)


def outside_references(root, tops):
    """'PATH:LINE: TEXT' for every line under TOPS that cites a path outside the repository."""
    hits = []
    needles = [p.encode() for p in OUTSIDE_PATHS]
    paths = []
    for top in tops:
        full = os.path.join(root, top)
        if os.path.isfile(full):
            paths.append(full)
        for d, dirs, names in os.walk(full):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            paths += [os.path.join(d, n) for n in sorted(names)]
    for path in sorted(paths):
        with open(path, "rb") as f:
            data = f.read()
        if not any(nd in data for nd in needles):
            continue
        for n, line in enumerate(data.splitlines(), 1):
            if any(nd in line for nd in needles):
                hits.append(f"{os.path.relpath(path, root)}:{n}: {line.decode('utf-8', 'replace').strip()[:120]}")
    return hits


class SelfTest(unittest.TestCase):
    """The checks themselves find what they must (on a hand-made tree)."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="linac_doc_links_test_")
        self.root = self._tmp.name
        os.makedirs(os.path.join(self.root, "docs"))
        with open(os.path.join(self.root, "docs", "page.md"), "w", encoding="utf-8") as f:
            f.write("# Page\n\n## Data parallelism (`mpirun`)\n\n### The SwiGLU backward's GEMM\n\n"
                    "## Notes\n\n## Notes\n\n## `linac info`\n")

    def tearDown(self):
        self._tmp.cleanup()

    def check(self, text):
        with open(os.path.join(self.root, "README.md"), "w", encoding="utf-8") as f:
            f.write(text)
        return broken_links(self.root, doc_files(self.root))

    def test_a_broken_link_is_found(self):
        problems = self.check("[gone](docs/missing.md) and [fine](docs/page.md)\n")
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("README.md:1: docs/missing.md", problems[0])

    def test_a_broken_anchor_is_found(self):
        problems = self.check("[a](docs/page.md#data-parallelism-mpirun) [b](docs/page.md#no-such-heading)\n"
                              "[c](#here) [d](#nowhere)\n\n## Here\n")
        self.assertEqual([p.split(": ", 1)[0] for p in problems], ["README.md:1", "README.md:2"], problems)
        self.assertIn("no-such-heading", problems[0])
        self.assertIn("nowhere", problems[1])

    def test_links_outside_the_repository_and_in_code_are_handled(self):
        problems = self.check("[out](../elsewhere.md)\n`[not a link](docs/missing.md)`\n"
                              "```\n[neither](docs/missing.md)\n```\n[web](https://example.com/x.md)\n")
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("outside the repository", problems[0])

    def test_slugs_and_repeated_headings(self):
        self.assertEqual(slug("Data parallelism (`mpirun`)"), "data-parallelism-mpirun")
        self.assertEqual(slug("The SwiGLU backward's GEMM"), "the-swiglu-backwards-gemm")
        self.assertEqual(slug("Transformer++ 125M: what changed, what was tried"),
                         "transformer-125m-what-changed-what-was-tried")
        self.assertEqual(slug("Tools: scaling.sh and kernel timelines"), "tools-scalingsh-and-kernel-timelines")
        found = anchors(os.path.join(self.root, "docs", "page.md"))
        self.assertTrue({"page", "notes", "notes-1", "the-swiglu-backwards-gemm", "linac-info"} <= found, found)

    def test_cli_rows_and_outside_paths_are_found(self):
        rows = cli_rows("## CLI\n\n| command | what |\n|---|---|\n| `linac a` | x |\n| `linac b` | y |\n\n## Next\n| z |\n")
        self.assertEqual(rows, ["| `linac a` | x |", "| `linac b` | y |"])
        os.makedirs(os.path.join(self.root, "src"))
        with open(os.path.join(self.root, "src", "x.h"), "w", encoding="utf-8") as f:
            f.write("// fine\n// math in " + OUTSIDE_PATHS[1] + "/x.md\n")
        self.assertEqual(outside_references(self.root, ["src", "docs"]), ["src/x.h:2: // math in " + OUTSIDE_PATHS[1] + "/x.md"])

    def test_an_undocumented_subcommand_is_found(self):
        names = subcommands('  static const std::vector<Command> table = {\n'
                            '      {"prepare", "tokenise", cmd_prepare},\n'
                            '      {"train", "train a model", cmd_train, true},\n  };\n')
        self.assertEqual(names, ["prepare", "train"])
        readme = "## CLI\n\n| command | what |\n|---|---|\n| `linac prepare` | x |\n| `linac trainer` | y |\n"
        cli_md = "# CLI\n\n## `linac prepare`\n\n## `linac train`\n"
        self.assertEqual(undocumented_commands(names, readme, cli_md), ["train: no row in README.md's CLI table"])
        self.assertEqual(undocumented_commands(["train"], readme.replace("trainer`", "train CONFIG`"), "# CLI\n"),
                         ["train: no '## `linac train`' heading in docs/cli.md"])

    def test_an_undocumented_config_key_is_found(self):
        os.makedirs(os.path.join(self.root, "src", "model"))
        with open(os.path.join(self.root, "src", "model", "m.cpp"), "w", encoding="utf-8") as f:
            f.write('opt.heads = r.get_int("heads", 8, 1, 64);\nauto t = m.child("train");\n'
                    'r.fail("heads", "not a key read");\nopt.chunk = r.require_int("chunk", 1, 64);\n')
        os.makedirs(os.path.join(self.root, "src", "cli"))
        with open(os.path.join(self.root, "src", "cli", "c.cpp"), "w", encoding="utf-8") as f:
            f.write('int n = args.get_int("steps", 10);\n')
        keys = config_keys(self.root)
        self.assertEqual(keys, {"heads": "src/model/m.cpp:1", "train": "src/model/m.cpp:2",
                                "chunk": "src/model/m.cpp:4"})
        doc = '| `model.heads` | 8 |\n| `train` | ... |\n`{"chunky": 1}`\n'
        self.assertEqual(undocumented_keys(keys, doc), ["chunk (read at src/model/m.cpp:4)"])

    def test_environment_variables_are_found(self):
        os.makedirs(os.path.join(self.root, "kernels", "k"))
        with open(os.path.join(self.root, "kernels", "k", "k.cu"), "w", encoding="utf-8") as f:
            f.write('// LINAC_NOT_A_STRING in a comment\nconst char* e = std::getenv("LINAC_K_KERNELS");\n')
        self.assertEqual(env_variables(self.root), {"LINAC_K_KERNELS": "kernels/k/k.cu:2"})


class RepositoryDocs(unittest.TestCase):
    def test_every_relative_link_resolves(self):
        files = doc_files(ROOT)
        self.assertIn("README.md", files)
        problems = broken_links(ROOT, files)
        self.assertEqual(problems, [], "broken links:\n" + "\n".join(problems))

    def test_readme_is_a_front_door(self):
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            text = f.read()
        n = len(text.splitlines())
        self.assertLessEqual(n, README_MAX_LINES, f"README.md has {n} lines; move detail into docs/")
        rows = cli_rows(text)
        self.assertGreater(len(rows), 0, "README.md has no CLI table under '## CLI'")
        long_rows = [f"{len(r)} chars: {r[:80]}..." for r in rows if len(r) > CLI_ROW_MAX_CHARS]
        self.assertEqual(long_rows, [], "CLI-table rows over %d characters (options go to docs/cli.md):\n%s"
                         % (CLI_ROW_MAX_CHARS, "\n".join(long_rows)))

    def test_every_subcommand_is_documented(self):
        texts = []
        for rel in ("src/cli/commands.cpp", "README.md", "docs/cli.md"):
            with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
                texts.append(f.read())
        names = subcommands(texts[0])
        self.assertGreaterEqual(len(names), 8, f"src/cli/commands.cpp: the command table was not found ({names})")
        missing = undocumented_commands(names, texts[1], texts[2])
        self.assertEqual(missing, [], "subcommands not documented:\n" + "\n".join(missing))

    def test_every_config_key_is_documented(self):
        keys = config_keys(ROOT)
        self.assertGreaterEqual(len(keys), 50, f"src/: too few config reads found ({len(keys)}): the pattern is stale")
        with open(os.path.join(ROOT, "docs", "config.md"), encoding="utf-8") as f:
            missing = undocumented_keys(keys, f.read())
        self.assertEqual(missing, [], "config keys not named in docs/config.md:\n" + "\n".join(missing))

    def test_every_environment_variable_is_documented(self):
        found = env_variables(ROOT)
        self.assertIn("LINAC_WORKSPACE_MB", found, "the pattern is stale")
        with open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8") as f:
            text = f.read()
        missing = [f"{v} (named at {w})" for v, w in sorted(found.items()) if f"`{v}`" not in text]
        self.assertEqual(missing, [], "LINAC_* variables not in docs/cli.md:\n" + "\n".join(missing))

    def test_no_file_refers_to_a_path_outside_the_repository(self):
        hits = outside_references(ROOT, OUTSIDE_SCAN)
        self.assertEqual(hits, [], "references to paths outside the repository:\n" + "\n".join(hits))


if __name__ == "__main__":
    unittest.main()
