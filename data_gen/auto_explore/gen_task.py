"""python -m data_gen.auto_explore.gen_task: questions whose answer is one file of a repository.

For each repository under ``--repo_dir`` (default ``data/auto_explore/repos_filtered``),
up to :data:`MAX_FILES_PER_REPO` files of depth <= :data:`MAX_TASK_DEPTH` are drawn
(seeded). The writer turns each file into tasks::

    {"question", "answer", "optimal_path", "filename" (relative to the repo root),
     "root" (the repo folder name), "n_level" (number of '/'), "model"}

* API writers (``--api openai|azure|local``) get a code, text or data prompt (by file
  kind) with a random block of 50-2000 tokens of the file and answer with
  ``QUERY: ...`` / ``ANSWER: ...`` lines (``Question:``/``Answer:`` are read too). A file whose
  answers hold no pair (two tries) gets no task; it is counted and logged, and a re-run asks again.
  Files are asked for side by side (``--max_concurrency``).
* ``--api oracle`` draws 1-3 questions from the file itself (Python symbols and
  docstrings via ``ast``, Markdown/RST headings, CSV/TSV columns, JSON/YAML top-level
  keys, names in other code, a text file's first line); the answer is the file's path.
  A question that more than one file of the repository would answer is never asked.

Only the files an episode shows are drawn (``envs.sandbox_copy.shown_files``): the entries left out (a
symlink, an unreadable file or folder, a path too long ...) are counted by reason in the summary.

Output: ``tasks/<repo>.json`` and ``tasks/data.json`` (all repos), in ``--output_dir``.
Finished files are journaled (key: repo, path and content digest), so re-runs skip them.
A run that writes no task at all ends with status 1.
"""

import ast
import csv
import json
import logging
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import yaml

from data_gen.auto_explore import TASKS_DIR, filtered_repos_dir, list_repos
from data_gen.common import Journal, Unfinished, item_rng, journal_name, print_counts
from envs.auto_explore_tasks import optimal_path, target_depth
from envs.sandbox import TOKEN_RE, file_kind
from envs.sandbox_copy import shown_files
from experiment_args import run_script
from utils.errors import UsageError
from utils.io import write_json
from utils.llm import concurrency, make_client, model_name, stops_on_llm_error
from utils.paths import file_digest

logger = logging.getLogger(__name__)

STEP = "auto_explore.gen_task"
MAX_FILES_PER_REPO = 100
MAX_TASK_DEPTH = 2
BLOCK_TOKENS = (50, 2000)
MAX_ORACLE_QUESTIONS = 3
MAX_READ_CHARS = 2_000_000

# --- API writer ---------------------------------------------------------------------------

SYSTEM = ("You write realistic questions that a developer new to a repository would ask, each answered "
          "by the content of one file of that repository.")
_FORMAT = """Write 1 to 3 questions that this content answers, each with its answer, in exactly this format:
QUERY: <question>
ANSWER: <answer>
The question must not name the file or quote it at length; it should be specific enough that only \
this file answers it."""
PROMPTS = {
    "code": "Here is a block of the code file {path} of the repository {repo}:\n```\n{block}\n```\n"
            "Ask about what this code does, defines or configures.\n" + _FORMAT,
    "text": "Here is a block of the document {path} of the repository {repo}:\n```\n{block}\n```\n"
            "Ask about what this document explains or specifies.\n" + _FORMAT,
    "data": "Here is a block of the data file {path} of the repository {repo}:\n```\n{block}\n```\n"
            "Ask about what this data holds: its columns, records or values.\n" + _FORMAT,
}
PROMPT_OF_KIND = {"code": "code", "exec": "code", "text": "text", "data": "data"}

# "QUERY:"/"ANSWER:" as asked, and what models write instead: "Question:"/"Answer:", "Q:"/"A:", with
# list markers, numbers or Markdown emphasis around them.
_PAIR_LINE = re.compile(r"^[\s>*#-]*(?:\d+[.)]\s*)?\**(QUERY|QUESTION|Q|ANSWER|A)\**\s*\d*\s*[:：]\**\s*(.*)$",
                        re.IGNORECASE)
_QUERY_WORDS = ("QUERY", "QUESTION", "Q")


def random_block(text: str, rng) -> str:
    """A random run of 50-2000 approximate tokens (``envs.sandbox.TOKEN_RE`` pieces) of ``text``."""
    pieces = [m.span() for m in TOKEN_RE.finditer(text)]
    if not pieces:
        return text
    length = int(rng.integers(BLOCK_TOKENS[0], BLOCK_TOKENS[1] + 1))
    if length >= len(pieces):
        return text
    start = int(rng.integers(0, len(pieces) - length + 1))
    line_start = text.rfind("\n", 0, pieces[start][0]) + 1  # whole first line reads better
    return text[line_start:pieces[start + length - 1][1]]


def parse_pairs(answer: str) -> list[tuple[str, str]]:
    """(question, answer) pairs from ``QUERY:`` / ``ANSWER:`` lines (or ``Question:``/``Answer:``,
    ``Q:``/``A:``); an answer may run over several lines."""
    pairs, query, lines, field = [], None, [], None

    def flush():
        if query and lines and " ".join(lines).strip():
            pairs.append((query, " ".join(" ".join(lines).split())))

    for raw in answer.splitlines():
        match = _PAIR_LINE.match(raw)
        if match and match.group(1).upper() in _QUERY_WORDS:
            flush()
            query, lines, field = " ".join(match.group(2).split()) or None, [], "query"
        elif match:
            lines, field = [match.group(2)], "answer"
        elif field == "answer" and raw.strip():
            lines.append(raw.strip())
    flush()
    return pairs


API_ATTEMPTS = 2  # answers asked for one file before it is left without tasks (until a re-run)


def api_pairs(client, repo: str, rel: str, text: str, rng) -> list[tuple[str, str]] | None:
    """The writer's pairs for one file; None when no answer (of :data:`API_ATTEMPTS`) held a pair."""
    prompt = PROMPTS[PROMPT_OF_KIND[file_kind(rel)]].format(path=rel, repo=repo, block=random_block(text, rng))
    answer = client.complete([{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
                             temperature=0.7, max_tokens=600, attempts=API_ATTEMPTS,
                             accept=lambda answer: None if parse_pairs(answer) else "no QUERY/ANSWER pair")
    return None if answer is None else parse_pairs(answer)


# --- oracle writer: questions drawn from the file itself ------------------------------------

_VERBS = frozenset(
    "add apply build calculate call check close collect compare compute construct convert copy create decode "
    "define draw emit encode execute filter find format generate get handle implement initialize iterate "
    "load make map merge normalize open parse print process provide raise read register remove render "
    "represent reset resolve return run sample save scan send serialize set show split start step stop "
    "store test update validate wrap write yield".split())
_OTHER_CODE_NAMES = [
    re.compile(r"^\s*func\s+(?:\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\(", re.M),  # Go
    re.compile(r"^\s*type\s+([A-Za-z_]\w*)\s+(?:struct|interface)\b", re.M),  # Go
    re.compile(r"\b(?:class|interface|struct|enum)\s+([A-Za-z_]\w*)"),  # C++, Java, C#
    re.compile(r"^[A-Za-z_][\w\s\*&:<>,]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*(?:const\s*)?\{", re.M),  # C-like
    re.compile(r"^\s*(?:function\s+)?([A-Za-z_]\w*)\s*\(\)\s*\{", re.M),  # shell
]
_CODE_KEYWORDS = frozenset({"if", "for", "while", "switch", "return", "else", "main", "catch", "do", "sizeof"})
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+])\1{2,}\s*$")


def _plain(text: str, max_chars: int = 80) -> bool:
    return 2 <= len(text) <= max_chars and all(" " <= c <= "~" for c in text) and "'" not in text


def _third_person(verb: str) -> str:
    if verb.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if verb.endswith("y") and verb[-2:-1] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def docstring_phrase(doc: str) -> str | None:
    """The first docstring line as a relative clause ("returns the ..."), or None if it does not read as one."""
    line = " ".join(doc.strip().splitlines()[0].split()).rstrip(".:")
    words = line.split()
    if not 3 <= len(words) <= 20 or not _plain(line, 160):
        return None
    first = words[0].lower()
    if first in _VERBS:
        first = _third_person(first)
    elif not (first.endswith("s") and first[:-1] in _VERBS or first.endswith("es") and first[:-2] in _VERBS):
        return None
    return " ".join([first, *words[1:]])


def python_questions(text: str) -> list[str]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return other_code_questions(text)
    questions = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) or node.name.startswith("_"):
            continue
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        questions.append(f"Which file defines the {kind} `{node.name}`?")
        doc = ast.get_docstring(node)
        phrase = docstring_phrase(doc) if doc else None
        if phrase:
            questions.append(f"Where is the {kind} that {phrase}?")
    return questions


def other_code_questions(text: str) -> list[str]:
    names = {m.group(1) for pattern in _OTHER_CODE_NAMES for m in pattern.finditer(text)}
    return [f"Which file defines `{name}`?" for name in sorted(names)
            if name not in _CODE_KEYWORDS and not name.startswith("_") and len(name) > 2]


def heading_questions(text: str, rst: bool) -> list[str]:
    titles, in_fence = [], False
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if not rst:
            match = re.match(r"^#{1,6}\s+(.+?)\s*#*\s*$", line)
            if match:
                titles.append(match.group(1))
        elif index + 1 < len(lines) and line.strip() and _RST_UNDERLINE.match(lines[index + 1]) \
                and len(lines[index + 1].strip()) >= len(line.strip()):
            titles.append(line.strip())
    return [f"Which document has a section titled '{t}'?" for t in dict.fromkeys(titles) if _plain(t)]


def first_line_question(text: str) -> list[str]:
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    if not lines or not 3 <= len(lines[0].split()) <= 12 or not _plain(lines[0], 100):
        return []
    return [f"Which file starts with the line '{lines[0]}'?"]


def table_questions(text: str, delimiter: str) -> list[str]:
    header = next(csv.reader(text.splitlines()[:1], delimiter=delimiter), [])
    columns = [c.strip() for c in header if _plain(c.strip(), 40)]
    return [f"Which data file has a column named '{c}'?" for c in dict.fromkeys(columns)]


def key_questions(text: str, is_json: bool) -> list[str]:
    try:
        value = json.loads(text) if is_json else next(iter(yaml.safe_load_all(text)), None)
    except (ValueError, yaml.YAMLError):
        return []
    if not isinstance(value, dict):
        return []
    return [f"Which file has the top-level key '{k}'?" for k in value if isinstance(k, str) and _plain(k, 60)]


def notebook_questions(text: str) -> list[str]:
    try:
        cells = json.loads(text).get("cells", [])
    except (ValueError, AttributeError):
        return []
    questions = []
    for cell in cells if isinstance(cells, list) else []:
        source = cell.get("source", "") if isinstance(cell, dict) else ""
        source = "".join(source) if isinstance(source, list) else str(source)
        if cell.get("cell_type") == "markdown":
            questions += heading_questions(source, rst=False)
        elif cell.get("cell_type") == "code":
            questions += [f"Which file defines the function `{name}`?"
                          for name in re.findall(r"^def\s+([A-Za-z]\w*)", source, re.M)]
    return questions


def candidate_questions(rel: str, text: str) -> list[str]:
    """Every question the oracle could ask about the file ``rel``, deduplicated, in file order."""
    suffix = Path(rel).suffix.lower()
    if suffix == ".py":
        found = python_questions(text)
    elif suffix == ".ipynb":
        found = notebook_questions(text)
    elif suffix in (".md", ".rst"):
        found = heading_questions(text, rst=suffix == ".rst") or first_line_question(text)
    elif suffix in (".csv", ".tsv"):
        found = table_questions(text, "," if suffix == ".csv" else "\t")
    elif suffix in (".json", ".yaml", ".yml"):
        found = key_questions(text, is_json=suffix == ".json")
    elif suffix == ".txt":
        found = first_line_question(text)
    else:
        found = other_code_questions(text)
    return list(dict.fromkeys(found))


def unique_questions(repo_path: Path, files: list[str]) -> dict[str, list[str]]:
    """Per file, the candidate questions that no other file of the repository would answer too."""
    by_file = {rel: candidate_questions(rel, read_text(repo_path / rel)) for rel in files}
    owners = Counter(q for questions in by_file.values() for q in questions)
    return {rel: [q for q in questions if owners[q] == 1] for rel, questions in by_file.items()}


# --- the pipeline step ---------------------------------------------------------------------


def read_text(path: Path) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read(MAX_READ_CHARS)


def repo_files(repo_path: Path, skipped: Counter) -> list[str]:
    """The files an AutoExplore episode can see, relative to the repo root, sorted; what it cannot (a symlink,
    an unreadable file, a path too long ...) counted in ``skipped`` (``envs.sandbox_copy.shown_files``)."""
    return shown_files(repo_path, skipped)


def make_task(question: str, answer: str, rel: str, repo: str, model: str) -> dict:
    task = {"question": question, "answer": answer, "optimal_path": [], "filename": rel, "root": repo,
            "n_level": target_depth(rel), "model": model}
    task["optimal_path"] = optimal_path(task)
    return task


def file_tasks(args, client, repo_path: Path, rel: str, digest: str, oracle_questions: list[str] | None) -> dict:
    """One file's tasks and what happened: status ok, malformed (API) or nothing (oracle)."""
    repo = repo_path.name
    rng = item_rng(args.seed, "gen_task", repo, rel, digest)
    model = model_name(args)
    if client is None:
        if not oracle_questions:
            return {"status": "nothing", "tasks": []}
        count = min(len(oracle_questions), int(rng.integers(1, MAX_ORACLE_QUESTIONS + 1)))
        picked = sorted(rng.choice(len(oracle_questions), size=count, replace=False))
        return {"status": "ok", "tasks": [make_task(oracle_questions[i], rel, rel, repo, model) for i in picked]}
    pairs = api_pairs(client, repo, rel, read_text(repo_path / rel), rng)
    if pairs is None:
        logger.warning("%s/%s: no answer of the writer held a QUERY/ANSWER pair; no task for this file "
                       "(a re-run asks again)", repo, rel)
        return Unfinished({"status": "malformed", "tasks": []}, "no QUERY/ANSWER pair")
    return {"status": "ok", "tasks": [make_task(q, a, rel, repo, model) for q, a in pairs]}


@stops_on_llm_error(STEP, "files")
def main(args) -> int:
    repos_dir = filtered_repos_dir(args)
    out_dir = Path(args.output_dir) if args.output_dir else TASKS_DIR
    repos = list_repos(repos_dir)
    if not repos:
        raise UsageError(f"--repo_dir: no repository folder in {str(repos_dir)!r}")
    if "data" in repos:
        raise UsageError(f"--repo_dir: a repository named 'data' in {str(repos_dir)!r} would overwrite "
                         f"{out_dir}/data.json; rename its folder")
    client = make_client(args)
    journal = Journal(out_dir, journal_name("gen_task", model_name(args), args.seed))
    items, sampled, skipped = [], {}, Counter()
    for repo in repos:
        repo_path = repos_dir / repo
        files = repo_files(repo_path, skipped)
        shallow = [rel for rel in files if target_depth(rel) <= MAX_TASK_DEPTH]
        rng = item_rng(args.seed, "gen_task", repo)
        picks = sorted(rng.choice(len(shallow), size=min(MAX_FILES_PER_REPO, len(shallow)), replace=False)) \
            if shallow else []
        sampled[repo] = [shallow[i] for i in picks]
        questions = unique_questions(repo_path, files) if client is None else {}
        for rel in sampled[repo]:
            digest = file_digest(repo_path / rel)
            items.append((f"{repo}/{rel}@{digest}", (repo_path, rel, digest, questions.get(rel))))
    results = journal.run(items, lambda payload: file_tasks(args, client, *payload), desc="auto_explore tasks",
                          **concurrency(client))
    by_repo = defaultdict(list)
    statuses = Counter()
    for (_, payload), result in zip(items, results):
        by_repo[payload[0].name] += result["tasks"]
        statuses[result["status"]] += 1
    all_tasks = []
    for repo in repos:
        write_json(out_dir / f"{repo}.json", by_repo[repo])
        all_tasks += by_repo[repo]
    write_json(out_dir / "data.json", all_tasks)
    depths = Counter(task["n_level"] for task in all_tasks)
    counts = {"repos": len(repos), "files": len(items), "files with tasks": statuses["ok"]}
    if client is None:
        counts["files with nothing to ask"] = statuses["nothing"]
    else:
        counts["malformed answers"] = statuses["malformed"]
    counts.update({f"skipped: {reason}": n for reason, n in sorted(skipped.items())})
    counts["tasks"] = len(all_tasks)
    counts.update({f"depth {d}": n for d, n in sorted(depths.items())})
    counts["output"] = str(out_dir)
    print_counts(STEP, counts, client)
    if not all_tasks:
        print(f"[{STEP}] no task was written: the next steps would have nothing to work on", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "python -m data_gen.auto_explore.gen_task"))
