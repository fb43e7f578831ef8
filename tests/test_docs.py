"""The README and the docs pages hold together: the README's size, its paper's table against the page it shows
(docs/results/paper_table.md) and that page against recipes/paper_table.py, every internal link, and every command
the pages name that is not played by tests/test_readme.py: each ``python -m MODULE`` answers ``--help``, and each
``python demo.py ...`` line is accepted by demo.py's parser."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_readme import section_anchors

PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]
PAPER_TABLE = REPO / "docs" / "results" / "paper_table.md"
# a page's `python -m` that names no module but a pattern of them (README, "1. Data generation")
TEMPLATES = {"data_gen.<env>.<step>"}
MODULE = r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*"


def _without_code(markdown: str) -> str:
    """The text outside fenced blocks and inline code, where a Markdown link is a link."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M))


def _table(markdown: str, header: str) -> list[list[str]]:
    """The cells of the first table whose header row starts with ``header``, links reduced to their text."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell.strip()) for cell in line.strip().strip("|").split("|")]
        rows.append(cells)
    return rows


def _section(markdown: str, heading: str) -> str:
    return markdown.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_keeps_to_300_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 300


def test_every_module_keeps_to_400_lines_and_the_root_to_six():
    """A module says one thing (a longer one is split by what it does), and the root holds the entry points and
    the few modules every layer reads: the subsystems are packages (rollout/, evaluation/, ...)."""
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    modules = [REPO / name for name in tracked.stdout.split() if not name.startswith("tests/")]
    long = {str(m.relative_to(REPO)): n for m in modules if (n := len(m.read_text().splitlines())) > 400}
    assert not long, long
    assert len([m for m in modules if m.parent == REPO]) <= 6


def test_the_readme_shows_the_papers_table_of_its_page_cell_by_cell():
    readme = _section((REPO / "README.md").read_text(), "## The paper's table beside ours")
    shown, page = _table(readme, "| model / method"), _table(PAPER_TABLE.read_text(), "| model / method")
    assert len(shown) == len(page) > 2
    for row, (ours, theirs) in enumerate(zip(shown, page, strict=True)):
        assert ours == theirs, f"row {row}: the README has {ours}, docs/results/paper_table.md {theirs}"


def test_each_column_of_the_readmes_table_links_its_page():
    readme = _section((REPO / "README.md").read_text(), "## The paper's table beside ours")
    header = next(line for line in readme.splitlines() if line.startswith("| model / method"))
    columns = [cell.strip() for cell in header.strip().strip("|").split("|")][1:]
    links = [re.fullmatch(r"\[[^\]]+\]\((docs/[a-z_]+\.md)\)", column) for column in columns]
    assert all(links), f"a column without its one link to a docs page: {columns}"


def test_the_papers_table_is_the_form_demo_writes_with_the_papers_numbers():
    """The page's columns, rows and the paper's figures are recipes/paper_table.py's (what ``demo.py --task all``
    writes), so that a figure of the paper cannot drift from the one the code holds."""
    from recipes import RECIPES
    from recipes.paper_table import PAPER, row_order

    table = _table(PAPER_TABLE.read_text(), "| model / method")
    columns = table[0][1:]
    assert columns == [title for title, _ in PAPER]
    rows = [cells[0] for cells in table[2:]]
    assert rows == row_order([(recipe, {}) for recipe in RECIPES.values()])
    paper = dict(PAPER)
    for cells in table[2:]:
        for column, cell in zip(columns, cells[1:], strict=True):
            ours, _, theirs = cell.partition(" / ")
            assert re.fullmatch(r"\d+\.\d% \(\d+\.\d–\d+\.\d\)|–", ours), (cells[0], column, cell)
            expected = paper[column].get(cells[0])
            assert (f"{expected}%" if expected is not None else "") == theirs, (cells[0], column, cell)


def _links(page: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", _without_code(page.read_text()))


def test_every_internal_link_finds_its_file_and_heading():
    """Relative links name a file that exists; a ``#anchor`` names a heading of its target (GitHub's anchors)."""
    broken, seen = [], 0
    for page in PAGES:
        for link in _links(page):
            if re.match(r"[a-z]+:", link):  # https:, mailto:
                continue
            seen += 1
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(REPO)}: {link} (no such file)")
            elif anchor and anchor not in section_anchors(target.read_text()):
                broken.append(f"{page.relative_to(REPO)}: {link} (no such heading in {target.name})")
    assert seen > 20, "hardly any link found: is the pattern still right?"
    assert broken == []


def test_links_are_read_outside_code_and_anchors_from_headings(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n## Two words\n[ok](#two-words) [bad](#three) `[code](#not-a-link)`\n```\n[x](y.md)\n```\n")
    assert _links(page) == ["#two-words", "#three"]
    assert {"title", "two-words"} == section_anchors(page.read_text())


def _python_m(text: str) -> list[str]:
    """The modules named by ``python -m MODULE`` (a line break may fall inside), templates such as
    ``data_gen.<env>.<step>`` whole."""
    return re.findall(rf"python\s+-m\s+({MODULE}(?:\.<\w+>)*)(?![\w.<])", text)


MODULES = sorted({module for page in PAGES for module in _python_m(page.read_text())} - TEMPLATES)


def test_every_python_m_on_the_pages_is_a_module_or_a_known_template():
    """Nothing a page names with ``python -m`` is left out of the ``--help`` check below without being listed."""
    for page in PAGES:
        text = page.read_text()
        assert len(re.findall(r"python\s+-m\b", text)) == len(_python_m(text)), page.name
    assert set(MODULES) >= {"envs.play", "evaluation.evaluate", "data_gen.taxi.reflection", "visualization.plot",
                            "benchmarks.rl_iteration", "utils.cpu"}


HANG = 600  # seconds: a guard against a hang only; `demo.py --help` once took over 120 beside three training runs


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG, input="")


@pytest.mark.parametrize("module", MODULES)
def test_every_module_a_page_names_answers_help(module):
    result = _run([sys.executable, "-m", module, "--help"])
    assert result.returncode == 0, f"python -m {module} --help\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    assert "usage" in result.stdout.lower(), f"python -m {module} --help printed no usage:\n{result.stdout[-2000:]}"


def _demo_commands(text: str) -> list[str]:
    """``python demo.py ...`` in inline code and in bash blocks (a ``  #`` comment cut off)."""
    inline = [" ".join(code.split()) for code in re.findall(r"`(python demo\.py[^`]*)`", text)]
    blocks = [line.split("  #")[0].strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)
              for line in block.splitlines() if line.strip().startswith("python demo.py")]
    return inline + blocks


DEMO_COMMANDS = sorted({command for page in PAGES for command in _demo_commands(page.read_text())})


def test_the_pages_name_demo_commands():
    assert any("--task all" in c for c in DEMO_COMMANDS) and any("--learners" in c for c in DEMO_COMMANDS)


@pytest.mark.parametrize("command", DEMO_COMMANDS)
def test_every_demo_command_a_page_names_is_accepted_by_its_parser(command):
    """argparse checks each flag as it reads it, so ``--help`` after them exits 0 only if all were accepted. A
    page's ``N`` (a seed) stands for a number; ``<GGUF_FILE>`` and ``CKPT`` stay the strings they are."""
    words = [("0" if word == "N" else word) for word in shlex.split(command)[2:]]
    result = _run([sys.executable, "demo.py", *words, "--help"])
    assert result.returncode == 0, f"{command}\n{result.stderr[-2000:]}"
