"""What this CPU computes natively, as the libraries' kernels see it: the one probe every CPU-dependent path asks.

x86 CPUs differ in the vector instructions a kernel may use, and torch's libraries choose their code path by them:
oneDNN (bfloat16 products, the packed weights of ``--packed_weights``, AMX where present), MKL (float32 products)
and ATen (torch's own kernels: norms, softmax, reductions). A path that needs a feature asks :func:`caps` before it
relies on it, and falls back to one that works where the feature is missing, saying so once
(``utils.log_filters.say_once``).

:func:`caps` reads the CPU's flags (``/proc/cpuinfo``) and the caps a user or CI puts on the libraries' paths:
``ONEDNN_MAX_CPU_ISA`` (oneDNN, which torch's own bfloat16 check follows too) and ``ATEN_CPU_CAPABILITY`` (ATen). So
``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` makes an AVX-512 machine take, and this probe report, the code
path of an AVX2-only one: the portable leg of ``make test`` runs the CPU-path-sensitive tests that way.

The reference numerical path (:data:`PINNED`, :func:`pin`) fixes every choice that moves a float32 run's last bits
between x86 CPUs with AVX2: the vector width of ATen's kernels and of NumPy's, MKL's code path (its conditional
numerical reproducibility, ``MKL_CBWR``), oneDNN's, and (in ``demo.py``) the threads of each stage. The demo runs on
it by default (``--native_numerics``: each library's fastest path for this CPU), so that one seed gives one table on
any x86 CPU with AVX2. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import sys
from pathlib import Path

# The code paths, oldest first, by the features that decide them.
LEVELS = ("below avx2", "avx2", "avx512", "avx512_bf16", "amx")
_NEEDS = {  # /proc/cpuinfo flags each level needs, on top of the level below it
    "avx2": {"avx2", "fma"},
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"},
    "avx512_bf16": {"avx512_bf16"},
    "amx": {"amx_bf16", "amx_tile"},
}
# ONEDNN_MAX_CPU_ISA's values (oneDNN's names, old and new) -> the highest level of ours they allow.
_ONEDNN_CAP = {
    "SSE41": "below avx2", "AVX": "below avx2",
    "AVX2": "avx2", "AVX2_VNNI": "avx2", "AVX2_VNNI_2": "avx2",
    "AVX512_CORE": "avx512", "AVX512_CORE_VNNI": "avx512",
    "AVX512_CORE_BF16": "avx512_bf16", "AVX512_CORE_FP16": "avx512_bf16", "AVX10_1_512": "avx512_bf16",
}
_ATEN_CAP = {"default": "below avx2", "avx2": "avx2"}  # ATEN_CPU_CAPABILITY's; avx512 is ATen's widest path

# Measured on a 2-core AMD EPYC with AVX2 only (torch 2.13.0, SmolLM2's shapes): what emulated bfloat16 costs.
EMULATED_BF16 = "1.2 GFLOP/s against 148 in float32 on a 2-core AVX2 EPYC, about 100x slower"

# The reference numerical path: the oldest x86 path the project supports, taken on every CPU that has it.
PINNED = {
    "ATEN_CPU_CAPABILITY": "avx2",  # ATen's kernels 256 bits wide: their sums in one order everywhere
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN's products (the float32 packed weights) by its AVX2 kernels
    # MKL's float32 products on its one branch that is the same code on Intel and AMD: MKL ignores every other
    # branch (AVX2 included) on a CPU that is not Intel's and takes its own path there (MKL_VERBOSE: CNR:AUTO)
    "MKL_CBWR": "COMPATIBLE,STRICT",
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",  # NumPy's kernels without AVX-512 (numpy>=2.4 names)
}
PINNED_CORES = 2  # demo.py shares this many threads among the stages that run at once, whatever the machine has


@dataclasses.dataclass(frozen=True)
class Caps:
    """This CPU as the kernels see it. ``flags``: the CPU's (None where they cannot be read: not Linux, not x86);
    ``onednn`` / ``aten``: the level each library's path is at, its cap from the environment applied; ``capped``:
    the variables that lowered it."""

    flags: frozenset[str] | None
    native: str | None  # the CPU's own level
    onednn: str | None
    aten: str | None
    capped: tuple[str, ...] = ()
    model: str = ""

    @property
    def native_bf16(self) -> bool | None:
        """Whether oneDNN computes bfloat16 natively here (avx512_bf16 or AMX, and not capped below them); None if
        unknown. Elsewhere bfloat16 is emulated: :data:`EMULATED_BF16`."""
        return None if self.onednn is None else _at_least(self.onednn, "avx512_bf16")

    @property
    def level(self) -> str | None:
        """The oldest path any library takes here: what this CPU is, for the code that runs on it."""
        return _oldest(self.onednn, self.aten)

    def describe(self) -> str:
        """The CPU's relevant capabilities in a few words, e.g. ``avx2 avx512 avx512_bf16, no amx (AMD EPYC)``, and
        where the environment caps them, the path taken."""
        if self.flags is None:
            return f"{platform.machine() or 'unknown'} CPU (its vector features unknown)"
        have = [level for level in LEVELS[1:] if _at_least(self.native, level)]
        missing = [level for level in LEVELS[1:] if level not in have]
        words = " ".join(have) or "no avx2"
        words += f", no {missing[0]}" if missing else ""
        words += f" ({self.model})" if self.model else ""
        if self.capped:
            words += f"; used as {self.level} ({', '.join(self.capped)})"
        return words


def _at_least(level: str | None, other: str) -> bool:
    return level is not None and LEVELS.index(level) >= LEVELS.index(other)


def _oldest(*levels: str | None) -> str | None:
    """The oldest of the known ``levels`` (None: unknown, or no cap); None if none is known."""
    known = [level for level in levels if level is not None]
    return min(known, key=LEVELS.index) if known else None


def level_of(flags: frozenset[str]) -> str:
    """The highest of :data:`LEVELS` whose features (and those of every level below) ``flags`` all have."""
    reached = LEVELS[0]
    for level in LEVELS[1:]:
        if not _NEEDS[level] <= flags:
            break
        reached = level
    return reached


def _read_cpuinfo(path: Path = Path("/proc/cpuinfo")) -> tuple[frozenset[str] | None, str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None, ""
    flags, model = None, ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags" and flags is None:
            flags = frozenset(value.split())
        elif key.strip() == "model name" and not model:
            model = value.strip()
    return flags, model


def probe(environ: dict | os._Environ = os.environ, cpuinfo: tuple[frozenset[str] | None, str] | None = None) -> Caps:
    """:class:`Caps` from the CPU's flags (``cpuinfo``: read from ``/proc/cpuinfo`` unless given) and the caps in
    ``environ``."""
    flags, model = _read_cpuinfo() if cpuinfo is None else cpuinfo
    native = None if flags is None else level_of(flags)
    capped = []
    onednn_value = (environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    onednn_cap = _ONEDNN_CAP.get(onednn_value)
    aten_value = (environ.get("ATEN_CPU_CAPABILITY") or "").strip().lower()
    aten_cap = _ATEN_CAP.get(aten_value)
    onednn = _oldest(native, onednn_cap)
    aten = _oldest(native, aten_cap)
    if onednn_cap is not None and onednn != native:
        capped.append(f"ONEDNN_MAX_CPU_ISA={onednn_value}")
    if aten_cap is not None and aten != native:
        capped.append(f"ATEN_CPU_CAPABILITY={aten_value}")
    return Caps(flags, native, onednn, aten, tuple(capped), model)


@functools.cache
def caps() -> Caps:
    """This process's :class:`Caps` (read once: torch's libraries read the variables once too)."""
    return probe()


def cpu_native_bf16() -> bool | None:
    """Whether this CPU computes bfloat16 natively, as oneDNN sees it; None if unknown."""
    return caps().native_bf16


def compute_line(dtype: str, device: str = "cpu", accelerator: str = "") -> str:
    """The line a training command or benchmark starts with: where it computes, in which dtype, and what that CPU
    has; for bfloat16 on a CPU that emulates it, its measured cost."""
    if device != "cpu":
        return f"compute: {dtype} on {accelerator or device}"
    found = caps()
    line = f"compute: {dtype} on the CPU: {found.describe()}"
    if dtype == "bfloat16" and found.native_bf16 is False:
        line += (f"; bfloat16 is emulated on it ({EMULATED_BF16}): float32 (no --cpu_bf16) is far faster here")
    return line


# --- the reference numerical path -----------------------------------------------------------------------------

def pinned(environ: dict | os._Environ = os.environ) -> bool:
    """Whether ``environ`` holds the reference numerical path (:data:`PINNED`)."""
    return all(environ.get(name) == value for name, value in PINNED.items())


def pin(environ: dict | os._Environ = os.environ) -> list[str]:
    """Put the reference numerical path into ``environ``, for torch, MKL, oneDNN and NumPy to read when they
    start: so before any of them is imported in this process, or for the processes it starts. Returns the
    variables it changed (a value the user set is replaced: the path is the point)."""
    changed = [name for name, value in PINNED.items() if environ.get(name) != value]
    for name in changed:
        environ[name] = PINNED[name]
    if environ is os.environ:
        caps.cache_clear()
    return changed


def main(argv: list[str]) -> int:
    """``python -m utils.cpu``: this CPU as the kernels see it, and the reference path's variables.
    ``python -m utils.cpu COMMAND ...``: run COMMAND on the reference path (make test's portable leg)."""
    if argv in ([], ["-h"], ["--help"]):
        found = caps()
        print(f"this CPU: {found.describe()}\nnative bfloat16 (oneDNN): {found.native_bf16}\nreference path: "
              + " ".join(f"{name}={value!r}" for name, value in PINNED.items())
              + "\nusage: python -m utils.cpu [COMMAND ...]  (runs COMMAND on the reference path)")
        return 0
    environ = dict(os.environ)
    pin(environ)
    sys.stdout.flush()
    try:
        os.execvpe(argv[0], argv, environ)  # no shell: the command's words as given
    except OSError as error:
        print(f"python -m utils.cpu: cannot run {argv[0]!r}: {error.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
