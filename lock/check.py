"""Compare the running interpreter's packages with the lock: ``python lock/check.py lock/test.txt``.

Every package the lock pins must be installed at exactly that version, and torch at the release of
``lock/torch.txt`` (any build: ``2.13.0+cpu`` is 2.13.0). A mismatch exits 1 with one line naming
each package and both versions. Packages the lock does not name (pip, torch's CUDA libraries) are
not checked. Standard library only, so that a drifted venv cannot break its own check.
"""

import re
import sys
from importlib import metadata
from pathlib import Path

TORCH_PIN = Path(__file__).with_name("torch.txt")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Typing_Extensions`` is ``typing-extensions``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """``{name: version}`` of every ``name==version`` line of a requirements file (hashes, comments
    and continuation lines are skipped)."""
    try:
        text = path.read_text()
    except OSError as error:
        raise SystemExit(f"lock check: cannot read {path}: {error.strerror}") from None
    pins = {canonical(m[1]): m[2] for line in text.splitlines() if (m := _PIN.match(line.strip()))}
    if not pins:
        raise SystemExit(f"lock check: {path} pins no package (expected lines like name==version)")
    return pins


def installed() -> dict[str, str]:
    """``{name: version}`` of the distributions this interpreter sees."""
    return {canonical(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}


def release(version: str) -> str:
    """A version without its local build label (``2.13.0+cpu`` -> ``2.13.0``)."""
    return version.split("+", 1)[0]


def mismatches(locks: list[Path], have: dict[str, str]) -> list[str]:
    """One ``name installed X, locked Y (file)`` entry per package that differs from its pin."""
    found = []
    for path in [*locks, TORCH_PIN]:
        local_label_ok = path == TORCH_PIN
        for name, want in read_pins(path).items():
            got = have.get(name)
            same = got is not None and (release(got) if local_label_ok else got) == want
            if not same:
                found.append(f"{name} installed {got or 'none'}, locked {want} ({path.name})")
    return found


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit("usage: python lock/check.py LOCK_FILE [LOCK_FILE ...]")
    found = mismatches([Path(a) for a in argv], installed())
    if found:
        print(f"lock check: the venv differs from the lock: {'; '.join(found)}. "
              "Rebuild it (make clean-venv, then make test), or refresh the lock (make lock).", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
