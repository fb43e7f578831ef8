"""The lock: what make installs is pinned with hashes, agrees with pyproject.toml, and drift is named."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "lock"


def _load_check():
    spec = importlib.util.spec_from_file_location("lock_check", LOCK / "check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _load_check()


def _requirements(*extras: str) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    found = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        found += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return found


def test_drift_is_one_line_naming_each_package_and_both_versions(tmp_path):
    lock = tmp_path / "test.txt"
    lock.write_text("alpha==1.0 \\\n    --hash=sha256:00\n    # via x\nBeta_Two==2.0\n")
    have = {"alpha": "1.1", "beta-two": "2.0", "torch": check.read_pins(check.TORCH_PIN)["torch"] + "+cpu"}
    assert check.mismatches([lock], have) == ["alpha installed 1.1, locked 1.0 (test.txt)"]
    del have["beta-two"]
    assert "beta-two installed none, locked 2.0 (test.txt)" in check.mismatches([lock], have)


def test_torch_is_compared_by_release_whatever_its_build():
    torch_pin = check.read_pins(check.TORCH_PIN)["torch"]
    for build in ("", "+cpu", "+cu128"):
        assert check.mismatches([], {"torch": torch_pin + build}) == []
    assert check.mismatches([], {"torch": "0.0.1+cpu"}) == [f"torch installed 0.0.1+cpu, locked {torch_pin} (torch.txt)"]


def test_the_command_fails_with_one_line_on_a_changed_pin(tmp_path):
    import tqdm

    lock = tmp_path / "test.txt"
    lock.write_text("tqdm==0.0.1\n")
    done = subprocess.run([sys.executable, str(LOCK / "check.py"), str(lock)], capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert f"tqdm installed {tqdm.__version__}, locked 0.0.1 (test.txt)" in line and "make lock" in line
    for bad in ([], [str(tmp_path / "missing.txt")]):
        done = subprocess.run([sys.executable, str(LOCK / "check.py"), *bad], capture_output=True, text=True)
        assert done.returncode != 0 and len(done.stderr.splitlines()) == 1


@pytest.mark.parametrize("name, extras", [("demo.txt", ()), ("test.txt", ("dev", "alfworld"))])
def test_each_lock_pins_with_hashes_what_pyproject_asks(name, extras):
    text = (LOCK / name).read_text()
    pins = check.read_pins(LOCK / name)
    torch_pin = check.read_pins(LOCK / "torch.txt")
    for requirement in _requirements(*extras):
        version = {**pins, **torch_pin}.get(check.canonical(requirement.name))
        assert version is not None, f"{requirement.name} is not in lock/{name}: run make lock"
        assert requirement.specifier.contains(version, prereleases=True), (requirement, version)
    pinned_lines = [line for line in text.splitlines() if re.match(r"^[A-Za-z0-9]", line)]
    assert len(pinned_lines) == len(pins)
    for line in pinned_lines:  # every pin is followed by at least one hash
        following = text.split(line, 1)[1].lstrip(" \\\n")
        assert following.startswith("--hash=sha256:"), line
    assert "torch" not in pins  # its build differs by machine: lock/torch.txt
    assert set(torch_pin) == {"torch"}


def test_the_gpu_lock_pins_the_gpu_extra_with_hashes_and_only_a_cuda_machine_installs_it():
    pins = check.read_pins(LOCK / "gpu.txt")
    extra = {check.canonical(r.name): r for r in _requirements("gpu")[len(_requirements()):]}
    assert set(pins) == set(extra) and all(extra[name].specifier.contains(pins[name]) for name in pins)
    text = (LOCK / "gpu.txt").read_text()
    assert text.count("--hash=sha256:") >= len(pins)
    dry = subprocess.run(["make", "-n", "-B", ".venv/.stamp-torch"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    gpu_branch, cpu_branch = dry.split("else", 1)
    assert "--require-hashes -r lock/gpu.txt" in gpu_branch and "lock/gpu.txt" not in cpu_branch


def test_the_demo_lock_agrees_with_the_test_lock_and_model_wheel_stands_alone():
    demo, test = check.read_pins(LOCK / "demo.txt"), check.read_pins(LOCK / "test.txt")
    assert {name: test.get(name) for name in demo} == demo
    assert check.read_pins(LOCK / "model.in").items() <= test.items()
    excluded = [line for line in (LOCK / "no-deps.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert excluded and not set(map(check.canonical, excluded)) & set(test)


def test_make_installs_only_from_the_lock_and_checks_it():
    dry = subprocess.run(["make", "-n", "-B", "test", "demo"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    torch_pin = next(iter(check.read_pins(LOCK / "torch.txt").items()))
    assert f"installing torch=={torch_pin[1]}" in dry
    installs = [line for line in dry.splitlines() if "pip install" in line and "torch==" not in line]
    assert installs and all("--no-deps --require-hashes -r lock/" in line for line in installs), installs
    assert "lock/check.py lock/test.txt" in dry and "lock/check.py lock/demo.txt" in dry
    assert dry.index("lock/check.py lock/test.txt") < dry.index("-m pytest")


def test_what_the_project_imports_is_declared_and_in_the_demo_lock():
    """Every library a project module imports when loaded (tests and benchmarks aside) is a declared
    dependency and pinned in lock/demo.txt, so that ``make demo``'s venv runs it: a library that only
    happens to be there (httpx once came along with alfworld's requirements, not openai's) fails here."""
    import ast
    from importlib import metadata

    local = {p.stem for p in REPO.glob("*.py")} | {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()}
    imported: dict[str, str] = {}
    for path in sorted(REPO.rglob("*.py")):
        relative = path.relative_to(REPO)
        if relative.parts[0].startswith(".") or relative.parts[0] in ("tests", "benchmarks", "lock", "build"):
            continue  # hidden folders (.venv, .cache, a developer's scratch) are not the project
        for node in ast.parse(path.read_text()).body:  # module level: what importing the module needs
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            for name in names:
                top = name.split(".")[0]
                if top not in local and top not in sys.stdlib_module_names:
                    imported.setdefault(top, str(relative))
    distributions = metadata.packages_distributions()
    declared = {check.canonical(r.name) for r in _requirements()}
    demo = set(check.read_pins(LOCK / "demo.txt")) | {"torch"}
    assert {"torch", "transformers", "openai"} <= imported.keys()
    for top, where in imported.items():
        names = {check.canonical(d) for d in distributions.get(top, [])}
        assert names & declared, f"{where} imports {top}, which pyproject.toml does not declare"
        assert names & demo, f"{where} imports {top}, which lock/demo.txt does not pin"


def test_make_refuses_a_python_older_than_the_lock_serves_before_it_makes_a_venv(tmp_path):
    """The lock is resolved for pyproject.toml's oldest Python (numpy 2.4, pandas 3 and others need 3.11): an
    older interpreter is one line naming it and the minimum, not a pip error halfway through the installs."""
    minimum = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"].removeprefix(">=")
    for name in ("Makefile", "pyproject.toml"):
        (tmp_path / name).write_text((REPO / name).read_text())
    (tmp_path / "lock").mkdir()
    for lock in LOCK.glob("*.txt"):
        (tmp_path / "lock" / lock.name).write_text(lock.read_text())
    old = tmp_path / "old-python"  # answers -V as Python 3.10 does, and fails the version check as it would
    old.write_text('#!/bin/sh\nif [ "$1" = "-V" ]; then echo "Python 3.10.13"; exit 0; fi\nexit 1\n')
    old.chmod(0o755)
    done = subprocess.run(["make", ".venv/.stamp-torch", f"PYTHON={old}"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode != 0 and not (tmp_path / ".venv").exists()
    assert f"make: {old} is Python 3.10.13; the lock needs Python >= {minimum}" in done.stderr, done.stderr
    dry = subprocess.run(["make", "-n", "-B", "lock"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert f"--python-version {minimum}" in dry  # make lock resolves for that same Python
