"""Small known repositories for the AutoExplore tests, and helpers to run the env and the pipeline on them.

* :func:`build_repo`: one repository for the env's own tests (a target at depth 2);
* :func:`build_repos`: two repositories for the data pipeline, with the junk ``filter_repo``
  must drop; :data:`KEPT` is what it must keep;
* :func:`build_awkward_repo`: one with entries that cannot be read and a path past PATH_MAX (the
  ``awkward_repo`` fixture of ``tests/conftest.py`` makes them unreadable).
"""

import json
import os
from pathlib import Path

from envs.auto_explore import AutoExploreEnv


def write(path, text: str | bytes = "x\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


TARGET = "src/utils/helpers.py"


def build_repo(root: Path) -> Path:
    """A small known tree: folders, allowed and disallowed files, a name with a space, an empty folder."""
    write(root / "README.md", "# Demo\nA demo repository.\n")
    write(root / "main.py", "import os\nprint('main')\n")
    write(root / "LICENSE", "\n".join(f"license line {i}" for i in range(30)) + "\n")
    write(root / "docs" / "my file.txt", "notes\n")
    write(root / "docs" / "guide.rst", "Guide\n=====\n")
    write(root / "src" / "data.csv", "".join(f"{i},{i * i}\n" for i in range(20)))
    write(root / "src" / "run.sh", "echo run\n")
    write(root / "src" / "image.png", "not really\n")
    write(root / TARGET, "def helper():\n    return 42\n")
    write(root / "src" / "utils" / "more.go", "package utils\n")
    (root / "empty").mkdir()
    return root


def make_task(repo, filename=TARGET, question="Which file defines helper()?") -> dict:
    return {"question": question, "answer": "helpers.py", "filename": filename, "root": str(repo),
            "optimal_path": [], "n_level": 2, "model": "test"}


def make_env(repo, **kwargs) -> AutoExploreEnv:
    kwargs.setdefault("tasks", [make_task(repo)])
    return AutoExploreEnv(**kwargs)


def run(env, commands):
    """Step through ``commands``; the list of (reward, terminated, truncated, info)."""
    steps = []
    for command in commands:
        _, reward, terminated, truncated, info = env.step_command(command)
        steps.append((reward, terminated, truncated, info))
    return steps


def tree(root) -> set[str]:
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in dirnames + filenames:
            found.add(os.path.normpath(os.path.join(rel, name)))
    return found


# What filter_repo must keep of the fixture repositories (see build_repos).
KEPT = {
    "alpha": {"README.md", "config.yaml", "contest.py", "docs/guide.rst", "pkg/__init__.py", "pkg/core.py",
              "pkg/io/loader.py", "pkg/io/readers/deep.py", "data/values.csv"},
    "beta": {"main.py", "settings.json", "utils/helpers.py", "utils/strings.py", "docs/intro.md",
             "data/table.tsv", "src/server.go"},
}


def build_repos(root):
    """Two small repositories: informative files at depths 0-3 and junk that filter_repo must drop."""
    alpha, beta = root / "alpha", root / "beta"
    write(alpha / "README.md", "# Alpha\n\nAlpha parses things.\n\n## Installation\n\nRun pip install alpha.\n\n"
                               "## Usage\n\nCall alpha.run().\n```\n# not a heading\n```\n")
    write(alpha / "config.yaml", "name: alpha\nversion: 1\nlayers:\n  - a\n  - b\n")
    write(alpha / "contest.py", 'def score_contest(entries):\n    """Compute the contest score of the entries."""\n'
                                "    return sum(entries)\n\n\nclass Judge:\n"
                                '    """Represents a contest judge."""\n')
    write(alpha / "docs" / "guide.rst", "Guide\n=====\n\nIntro.\n\nConfiguration\n-------------\n\nSet things.\n")
    write(alpha / "pkg" / "__init__.py", '"""The alpha package."""\nfrom pkg.core import run\n')
    write(alpha / "pkg" / "core.py", 'def run(config):\n    """Run the alpha pipeline on a config."""\n'
                                     "    return Pipeline(config)\n\n\nclass Pipeline:\n"
                                     '    """Builds the processing steps of alpha."""\n\n'
                                     "def helper_tool():\n    return 1\n")
    write(alpha / "pkg" / "io" / "loader.py", 'def load_table(path):\n    """Load a table from a csv file."""\n'
                                              "    return open(path).read()\n")
    write(alpha / "pkg" / "io" / "readers" / "deep.py", "def deep_read():\n    return 'deep'\n")
    write(alpha / "data" / "values.csv", "city,population,area\nParis,2100000,105\nLyon,520000,48\n")
    # junk
    write(alpha / "LICENSE", "MIT License\n" * 5)
    write(alpha / "LICENSE.md", "MIT License\n" * 5)
    write(alpha / "requirements.txt", "numpy\npyyaml\n")
    write(alpha / "Makefile", "all:\n\techo hi\n")
    write(alpha / ".hidden.py", "print('hidden file')\n")
    write(alpha / "_private.py", "def private():\n    return 0\n")
    write(alpha / "tiny.py", "x = 1\n")
    write(alpha / "blob.txt", "é" * 60)
    write(alpha / "naïve.py", "print('non-ascii name')\n")
    write(alpha / "tests" / "test_contest.py", "def test_score():\n    assert True\n")
    write(alpha / "examples" / "demo.py", "print('a demo of alpha')\n")
    write(alpha / "ci" / "build.sh", "echo building alpha\n")
    write(alpha / "notes" / "_draft.md", "# Draft\nnothing yet\n")
    write(alpha / "docs" / "conf.py", "project = 'alpha docs'\n")
    write(alpha / ".git" / "config.yaml", "core: {bare: false}\n")
    os.symlink("contest.py", alpha / "link.py")

    write(beta / "main.py", 'def main_entry():\n    """Start the beta command line."""\n\n\n'
                            "def shared_name():\n    return 'main'\n")
    write(beta / "utils" / "helpers.py", "def shared_name():\n    return 'helpers'\n\n\n"
                                         'def format_money(x):\n    """Format an amount of money."""\n'
                                         "    return f'{x:.2f}'\n")
    write(beta / "utils" / "strings.py", "def slugify(text):\n    return text.lower().replace(' ', '-')\n")
    write(beta / "docs" / "intro.md", "# Beta intro\n\n## Getting started\n\nInstall beta.\n")
    write(beta / "data" / "table.tsv", "id\tlabel\tscore\n1\ta\t0.5\n2\tb\t0.7\n")
    write(beta / "settings.json", json.dumps({"debug": False, "workers": 4}))
    write(beta / "src" / "server.go", "package app\n\nfunc StartServer(port int) error {\n\treturn nil\n}\n")
    return root


# The entries of build_awkward_repo that cannot be read (the awkward_repo fixture makes them so), and the secret
# one of them holds.
UNREADABLE = ("pkg/secret.py", "locked")
UNREADABLE_SECRET = "UNREADABLE-5e1d7c02"


def build_awkward_repo(root: Path) -> Path:
    """A repository of readable files (``README.md``, ``pkg/core.py``), the :data:`UNREADABLE` ones, and a chain
    of folders whose full path passes PATH_MAX with a file at its end (made one folder at a time, relative to the
    last one: no call can name the whole path)."""
    write(root / "README.md", "# Awkward\n\nA repository with entries that cannot be read.\n")
    write(root / "pkg" / "core.py", 'def run_awkward(config):\n    """Run the awkward pipeline on a config."""\n'
                                    "    return config\n")
    write(root / "pkg" / "secret.py", f"KEY = '{UNREADABLE_SECRET}'\n")
    write(root / "locked" / "inner.py", f"KEY = '{UNREADABLE_SECRET}'\n")
    limit, length = os.pathconf(root, "PC_PATH_MAX"), len(os.fsencode(root / "chain"))
    folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in ["chain"] + ["d" * 200] * ((limit - length) // 201 + 1):
            os.mkdir(name, dir_fd=folder)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=folder)
            os.close(folder)
            folder = inner
        file = os.open("far.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=folder)
        os.write(file, b"def far_away():\n    return 'far'\n")
        os.close(file)
    finally:
        os.close(folder)
    return root


SEED = 7  # the data pipeline tests' seed


def make(**overrides):
    """The data scripts' arguments (imported here: the sandbox tests' player processes need this module
    without torch and transformers, 3 s a start)."""
    from experiment_args import ScriptArguments

    values = {"model_name": "tiny-gpt2", "seed": SEED, "api": "oracle"}
    values.update({k: str(v) if hasattr(v, "__fspath__") else v for k, v in overrides.items()})
    return ScriptArguments(**values)
