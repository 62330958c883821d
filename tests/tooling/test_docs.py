"""The user documentation (README.md and docs/*.md) stays true to the repository:

- every relative link resolves to a file or folder, and a `page.md#anchor` link to a heading of that page (GitHub's
  anchors);
- every flag in a documented command that runs one of the scripts is a flag of that script (its `--help`);
- the README stays a landing page (at most README_MAX_LINES lines);
- no commit hashes and no issue numbers: they belong in benchmark/results/, not in what users read;
- every script has its page in docs/, linked from the README;
- every number in a results table of a script's page is in a results file that the page's results section links to
  (or in benchmark/reference.json, CleanRL's published numbers), and every number of a README results row in one
  that its script's page links to;
- tests/README.md names every file of tests/;
- no tracked file outside tests/ speaks of leases or device time.

Each check has a test of its own that feeds it a broken example, so a check that no longer sees anything fails.
"""

import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from scripts import REPO, SCRIPTS

README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 200


def user_docs() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def doc_id(path: Path) -> str:
    return str(path.relative_to(REPO))


# MARKDOWN ----------------------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)


def code_blocks(text: str) -> list[str]:
    """The contents of the fenced code blocks."""
    return [block.split("\n", 1)[1].rsplit("\n", 1)[0] if "\n" in block else "" for block in _fenced(text)]


def _fenced(text: str) -> list[str]:
    return [m.group(0) for m in FENCE.finditer(text)]


def prose(text: str) -> str:
    """The text without its code blocks and code spans (a link or heading inside code is not one)."""
    return CODE_SPAN.sub(lambda m: "\0" * len(m.group(2)), FENCE.sub("", text))


def links(text: str) -> list[str]:
    """The targets of the Markdown links and images of a page."""
    return LINK.findall(prose(text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text as rendered (links by their text, code without backticks), lower
    case, with everything but letters, digits, spaces, hyphens and underscores removed, and spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor, repeated headings numbered as GitHub numbers them (`name`, `name-1`, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for _, heading in HEADING.findall(FENCE.sub("", text)):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    """The relative links of the page `path` that lead nowhere: a missing file or folder, or a missing heading."""
    text = path.read_text()
    broken = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {resolved.name}")
    return broken


# COMMANDS ----------------------------------------------------------------------------------------

SCRIPT_FILES = {f"{name}.py": name for name in SCRIPTS}


def commands(text: str) -> list[str]:
    """The command lines of a page: every line of its code blocks (backslash continuations joined), and every code
    span of its prose, each split at `&&`, `||`, `;` and `|`."""
    lines = []
    for block in code_blocks(text):
        lines += block.replace("\\\n", " ").splitlines()
    lines += [m.group(2) for m in CODE_SPAN.finditer(FENCE.sub("", text))]
    found = []
    for line in lines:
        line = re.sub(r"(^|\s)#.*$", "", line)  # a comment
        found += [part.strip() for part in re.split(r"&&|\|\||;|\|", line) if part.strip()]
    return found


def script_flags(command: str) -> tuple[str, list[str]] | None:
    """(script, the flags given to it) if `command` runs one of the scripts with Python or torchrun
    (`python ppo.py ...`, `.venv/bin/python ppo.py ...`, `WANDB_MODE=offline python ppo.py ...`,
    `torchrun ... ppo_atari_multigpu.py ...`), else None."""
    try:
        tokens = shlex.split(command)
    except ValueError:
        tokens = command.split()
    for i, token in enumerate(tokens):
        name = SCRIPT_FILES.get(Path(token).name)
        if name is None:
            continue
        launchers = [Path(t).name for t in tokens[:i]]
        if any(t.startswith("python") or t == "torchrun" for t in launchers):
            return name, [t.split("=", 1)[0] for t in tokens[i + 1 :] if t.startswith("--")]
        return None
    return None


def documented_runs() -> list[tuple[str, str, str, list[str]]]:
    """(page, command, script, flags) for every documented command that runs a script."""
    runs = []
    for path in user_docs():
        for command in commands(path.read_text()):
            found = script_flags(command)
            if found is not None:
                runs.append((doc_id(path), command, *found))
    return runs


def help_flags(help_text: str) -> set[str]:
    """The flags a tyro `--help` lists: those in the option column of its table (`--seed INT`,
    `--cuda, --no-cuda`), not the flags that a description mentions."""
    flags = set()
    for line in help_text.splitlines():
        cell = line.strip().strip("│").strip()
        if cell.startswith("-"):
            flags.update(re.findall(r"--[a-z0-9][a-z0-9-]*", re.split(r"\s{2,}", cell)[0]))
    return flags


@pytest.fixture(scope="session")
def script_help() -> dict[str, set[str]]:
    """Each documented script's flags, from one `--help` per script per session (in fresh processes, at once)."""
    names = sorted({script for _, _, script, _ in documented_runs()})
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="200", PYTHONPATH=str(REPO))

    def run_help(name: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(REPO / f"{name}.py"), "--help"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = dict(zip(names, pool.map(run_help, names)))
    for name, result in results.items():
        assert result.returncode == 0, f"{name}.py --help failed: {result.stderr}"
    return {name: help_flags(result.stdout) for name, result in results.items()}


# THE CHECKS --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", user_docs(), ids=doc_id)
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_the_link_check_sees_a_missing_file_and_a_missing_anchor(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text(
        "# Other\n\n## Usage: `ppo.py` and [flags](flags.md)\n\n## Usage: `ppo.py` ...\n"
    )
    page.write_text(
        "# Page\n\n[ok](other.md#usage-ppopy-and-flags) [ok too](other.md#usage-ppopy-) [self](#page)\n"
        "[gone](missing.md) [no heading](other.md#nowhere) ![no image](plots/x.png) [web](https://example.org/x)\n"
        "```bash\n[not a link](inside-code.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nowhere: no heading with the anchor #nowhere in other.md",
        "plots/x.png: no such file",
    ]


def test_anchors_are_githubs():
    text = (
        "# ppo-lab\n## The fast path\n## Samplers through Redis (`ppo_continuous_action_redis.py`)\n## Usage\n## Usage"
    )
    assert anchors(text) == {
        "ppo-lab",
        "the-fast-path",
        "samplers-through-redis-ppo_continuous_action_redispy",
        "usage",
        "usage-1",
    }


def test_every_documented_flag_is_a_flag_of_its_script(script_help):
    runs = documented_runs()
    assert {script for _, _, script, _ in runs} == set(SCRIPTS), "a script with no documented command"
    unknown = [
        f"{page}: {flag} is not a flag of {script}.py: {command}"
        for page, command, script, flags in runs
        for flag in flags
        if flag not in script_help[script]
    ]
    assert unknown == []


def test_the_flag_check_reads_commands_as_they_are_run():
    text = (
        "Run `python ppo.py --env-id Acrobot-v1`, not `--seed` alone.\n\n```bash\n"
        "for s in 1 2; do python ppo.py --seed=$s --save-model; done   # every seed\n"
        "WANDB_MODE=offline .venv/bin/python ppo.py --track\n"
        "torchrun --standalone --nproc_per_node=2 ppo_atari_multigpu.py --env-id Breakout \\\n    --num-envs 8\n"
        "cp ppo.py my_ppo.py && .venv/bin/python my_ppo.py --no-such-flag\n"
        "python -m benchmark.scores runs/ --plots plots\n```\n"
    )
    found = [script_flags(command) for command in commands(text)]
    assert [f for f in found if f is not None] == [
        ("ppo", ["--seed", "--save-model"]),
        ("ppo", ["--track"]),
        ("ppo_atari_multigpu", ["--env-id", "--num-envs"]),
        ("ppo", ["--env-id"]),
    ]


def test_help_flags_are_the_option_column():
    text = (
        "╭─ options ───╮\n│ -h, --help              show this help message and exit │\n"
        "│ --cuda, --no-cuda       if toggled, cuda is used (implies --compile) │\n"
        "│ --eval-max-steps INT    the Atari scripts' limit (their --max-episode-steps) │\n"
        "│                         more text, --not-a-flag │\n╰─────╯\n"
    )
    assert help_flags(text) == {"--help", "--cuda", "--no-cuda", "--eval-max-steps"}


def test_the_readme_is_a_landing_page():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move the detail to docs/"


HASH = re.compile(r"(?<![\w./-])[0-9a-f]{7,40}(?![\w/-])")
ISSUE = re.compile(r"\bissues?\s+(?:no\.?\s*)?#?\d+", re.I)


def diary_marks(text: str) -> list[str]:
    """Commit hashes (7 to 40 hex digits as a word that is not a number) and issue numbers in `text`."""
    hashes = [word for word in HASH.findall(text) if not word.isdigit()]
    return hashes + ISSUE.findall(text)


@pytest.mark.parametrize("path", user_docs(), ids=doc_id)
def test_no_commit_hashes_or_issue_numbers(path):
    assert diary_marks(path.read_text()) == []


def test_the_diary_check_sees_hashes_and_issues():
    text = "measured at commit df85ad5 (issue 24), see c70d820; 1764000000 steps, seed 1234567, 2026-11-24, Issue #7"
    assert diary_marks(text) == ["df85ad5", "c70d820", "issue 24", "Issue #7"]


LENDING = re.compile(r"lease|device time", re.I)  # the terms a machine was lent on, not what a user with a GPU runs


def lending_words(text: str) -> list[str]:
    """The lines of `text` that speak of leases or device time."""
    return [line.strip() for line in text.splitlines() if LENDING.search(line)]


def test_the_product_never_speaks_of_leases_or_device_time():
    """Every tracked file outside tests/ (which names the words here): scripts, ppolab/, benchmark/, its results,
    the docs and the README."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    found = []
    for name in tracked.splitlines():
        path = REPO / name
        if name.startswith("tests/") or not path.is_file():
            continue
        try:
            found += [f"{name}: {line}" for line in lending_words(path.read_text())]
        except UnicodeDecodeError:  # a picture
            continue
    assert found == []


def test_the_lending_check_sees_the_words():
    text = "SPS 2,693\nwithin the 15-minute LEASE window\nrelease the handlers\nDevice time left: 4 min\n"
    assert lending_words(text) == [
        "within the 15-minute LEASE window",
        "release the handlers",
        "Device time left: 4 min",
    ]


def test_every_script_has_its_page_linked_from_the_readme():
    readme_links = set(links(README.read_text()))
    missing = [name for name in SCRIPTS if not (DOCS / f"{name}.md").is_file()]
    unlinked = [name for name in SCRIPTS if f"docs/{name}.md" not in readme_links]
    assert (missing, unlinked) == ([], [])


# NUMBERS IN RESULTS TABLES -----------------------------------------------------------------------

RESULTS = REPO / "benchmark" / "results"
REFERENCE = REPO / "benchmark" / "reference.json"  # CleanRL's published numbers, which every results table may quote
# a number as a table cell writes it: an optional sign, digits (thousands with commas), an optional fraction; not a
# piece of a word, an id, a version or a range (Hopper-v4, 300k, 1.2.0, 0-100k)
NUMBER = re.compile(r"(?<![\w.,/-])([-+]?)(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?![\w.]|,\d)")


def numbers(text: str) -> list[str]:
    """The numbers of `text` worth checking: those with a fraction (scores, means, spreads) and whole numbers of
    three digits or more (steps, games, SPS); small whole numbers (seeds, counts) say too little."""
    found = []
    for sign, whole, fraction in NUMBER.findall(text):
        if fraction or len(whole.replace(",", "")) >= 3:
            found.append(sign.replace("+", "") + whole.replace(",", "") + fraction)
    return found


def appears_in(number: str, source: str) -> bool:
    """Whether `number` (as a page writes it) is a number of `source` at the page's precision: 2588.7 is in a
    file that has 2588.69, 1,170 in one that has 1170."""
    number = number.replace(",", "")
    places = len(number.split(".")[1]) if "." in number else 0
    return any(f"{float(found):.{places}f}" == f"{float(number):.{places}f}" for found in numbers_loose(source))


def numbers_loose(text: str) -> set[str]:
    return {sign.replace("+", "") + whole.replace(",", "") + fraction for sign, whole, fraction in NUMBER.findall(text)}


def tables(text: str) -> list[list[list[str]]]:
    """The Markdown tables of `text` (outside code blocks), each as its rows of cells, the header row left out."""
    found, rows = [], []
    for line in FENCE.sub("", text).splitlines() + [""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            found.append([row for row in rows[1:] if not all(set(cell) <= set("-: ") for cell in row)])
            rows = []
    return found


def results_section(text: str) -> str:
    """The page's results: from its heading that names results (`## Experiment results`, `## Results at a
    glance`) to the next heading of that level."""
    match = re.search(r"^(#{1,6}) [^\n]*[Rr]esults[^\n]*$", text, re.M)
    if not match:
        return ""
    rest = text[match.end() :]
    end = re.search(rf"^#{{1,{len(match.group(1))}}} ", rest, re.M)
    return match.group(0) + "\n" + (rest[: end.start()] if end else rest)


def cited_results(page: Path, section: str) -> list[Path]:
    """The results files a page's results section links to (benchmark/results/*.md), and benchmark/reference.json."""
    cited = [(page.parent / target.partition("#")[0]).resolve() for target in links(section)]
    return [path for path in cited if path.suffix == ".md" and RESULTS in path.parents] + [REFERENCE]


def unbacked_numbers(page: Path, rows: list[list[str]], sources: list[Path], skip: int = 1) -> list[str]:
    """Every number in the cells of `rows` (after the first `skip` cells of each, which name the row) that none of
    `sources` holds."""
    text = "\n".join(path.read_text() for path in sources)
    return [
        f"{page.parent.name}/{page.name}: {number} ({' | '.join(row[:skip])}) is in none of {[p.name for p in sources]}"
        for row in rows
        for cell in row[skip:]
        for number in numbers(cell)
        if not appears_in(number, text)
    ]


def page_results_check(page: Path) -> list[str]:
    section = results_section(page.read_text())
    sources = cited_results(page, section)
    return [problem for table in tables(section) for problem in unbacked_numbers(page, table, sources)]


def readme_results_check(readme: Path = README) -> list[str]:
    """Each README results row against the results files its script's page cites in its results section."""
    problems = []
    for table in tables(results_section(readme.read_text())):
        for row in table:
            script = row[0].strip("`").removesuffix(".py")
            page = readme.parent / "docs" / f"{script}.md"
            sources = cited_results(page, results_section(page.read_text()))
            problems += unbacked_numbers(readme, [row], sources, skip=2)
    return problems


@pytest.mark.parametrize("path", [*sorted(DOCS.glob("ppo*.md")), DOCS / "tuning.md"], ids=doc_id)
def test_every_number_in_a_results_table_is_in_a_results_file_the_page_cites(path):
    assert page_results_check(path) == []


def test_every_number_in_the_readme_results_is_in_a_results_file_its_scripts_page_cites():
    assert readme_results_check() == []


def test_the_numbers_check_sees_a_changed_number(tmp_path):
    assert numbers(
        "| 2776.43 ± 150.77 | -29.46 | 1,740,800 steps (17.4%) | Hopper-v4, 300k, 1.2.0, 0-100k, seed 3 |"
    ) == [
        "2776.43",
        "150.77",
        "-29.46",
        "1740800",
        "17.4",
    ]
    assert (
        appears_in("2588.7", "| 2588.69 |") and appears_in("1,170", "SPS 1170") and not appears_in("2588.7", "2588.6")
    )
    # the real page with one number changed: the check names it, and only it
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "benchmark").symlink_to(REPO / "benchmark")
    page = docs / "ppo_continuous_action.md"
    text = (DOCS / "ppo_continuous_action.md").read_text()
    assert "| 2776.43 ± 150.77 |" in text
    page.write_text(text.replace("| 2776.43 ± 150.77 |", "| 2776.43 ± 105.77 |", 1))
    (problem,) = page_results_check(page)
    assert problem.startswith("docs/ppo_continuous_action.md: 105.77 (Hopper-v4) is in none of ['mujoco.md',")
    # and a README row whose number is not in its script's page's results files
    readme = tmp_path / "README.md"
    readme.write_text(
        "## Results at a glance\n\n| script | env | ours | CleanRL |\n|---|---|---|---|\n"
        "| `ppo_continuous_action.py` | Hopper-v4, 1M | 2776.43 ± 150.77 (3 seeds) | 2382.86 ± 271.74 |\n"
        "| `ppo_continuous_action.py` | Hopper-v4, 1M | 2776.43 ± 151.77 (3 seeds) | 2382.86 ± 271.74 |\n"
    )
    (problem,) = readme_results_check(readme)
    assert "151.77" in problem


def test_tests_readme_maps_every_test_file():
    tests = REPO / "tests"
    text = (tests / "README.md").read_text()
    files = sorted(
        path.name for path in [*tests.glob("*.py"), *tests.glob("tooling/*.py")] if path.name != "__init__.py"
    )
    assert [name for name in files if f"`{name}`" not in text] == []
