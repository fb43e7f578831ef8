"""python -m gpu.column --column NAME --seed N: one column of the paper's table on one GPU, packed to travel back.

1. **Set up** (with ``--bundle``, the parts :mod:`gpu.bundle` made): each part present is checked piece by piece
   against its manifest and kept in ``build/gpu-stage``; while a part is missing, the command says which and stops
   (exit 3), so that a window's calls can bring one part each. Once every piece is there, the wheels are installed
   into ``build/gpu-stage/site`` (first on ``PYTHONPATH``: the lock's versions win over the image's), the model is
   put together and checked against its SHA-256, and ALFWorld's games unpacked (``REFLECTRL_SHARED``). A machine
   that has the project's packages (``make gpu-column`` without a bundle: the venv of the lock) skips this.
2. **Run** ``demo.py --task NAME --profile gpu --seed N`` (recipes/gpu.py) on this Python, its output in a log. The
   demo resumes: a call cut by its time limit keeps every stage that finished, and the same command goes on.
3. **Pack** what it measured into ``--out`` (at most 8 files, each under 16 MiB): ``results.md`` (the seed's table,
   the reflector's accuracy, where the time went, with the command, the commit, the device and the wall time),
   ``results.json``, ``metrics.jsonl`` (every RL run's iterations), ``episodes.jsonl`` (every evaluation episode),
   ``log.txt`` (the demo's output, and the end of each stage's log) and the curves.

Only the standard library is imported here, before the packages are in place: the demo runs in its own process.
"""

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
STAGE = REPO_ROOT / "build" / "gpu-stage"
MANIFEST = "manifest.json"  # in every part: its pieces, their parts and SHA-256s (gpu.bundle writes it)
COLUMNS = ("taxi_pickup", "taxi_dropoff", "auto_explore", "alfworld")
MISSING_PARTS = 3  # the exit status while parts are still to come
MAX_FILES, MAX_BYTES = 8, 16 * 2**20  # what comes back from a GPU window's folder
STAGE_LOG_LINES = 40  # the end of each stage's log kept in log.txt
LOG_BYTES = 4 * 2**20  # log.txt keeps the end of the demo's output within this


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def stage(bundle: Path, stage_dir: Path) -> dict:
    """Keep every piece of the parts under ``bundle`` in ``stage_dir/pieces`` (checked); the manifest. Raises
    :class:`Missing` with the parts still to come."""
    manifests = sorted(bundle.glob(f"part-*/{MANIFEST}"))
    kept = stage_dir / MANIFEST
    if not manifests and not kept.is_file():
        raise SystemExit(f"gpu.column: no part-*/{MANIFEST} under {bundle} (make gpu-bundle makes them)")
    manifest = json.loads((manifests[0] if manifests else kept).read_text(encoding="utf-8"))
    if kept.is_file():
        earlier = json.loads(kept.read_text(encoding="utf-8"))
        if earlier["pieces"] != manifest["pieces"]:
            shutil.rmtree(stage_dir)  # another bundle was staged before: start again
    pieces = stage_dir / "pieces"
    pieces.mkdir(parents=True, exist_ok=True)
    (stage_dir / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    for piece in manifest["pieces"]:
        target, source = pieces / piece["name"], bundle / f"part-{piece['part']}" / piece["name"]
        if target.is_file() and target.stat().st_size == piece["bytes"]:
            continue
        if source.is_file():
            if sha256(source) != piece["sha256"]:
                raise SystemExit(f"gpu.column: {source} does not match its manifest (a damaged copy: make it again)")
            shutil.copyfile(source, target)
    missing = sorted({piece["part"] for piece in manifest["pieces"] if not (pieces / piece["name"]).is_file()})
    if missing:
        raise Missing(missing, manifest["parts"])
    return manifest


class Missing(Exception):
    def __init__(self, parts: list[int], total: int):
        super().__init__(f"parts {', '.join(f'part-{n}' for n in parts)} of {total} are still to come: carry each "
                         "in a call running the same command (the parts already here are kept)")


def set_up(manifest: dict, stage_dir: Path, python: str) -> tuple[Path, dict[str, str]]:
    """Install the wheels, put the model together, unpack the games (each once); the model file and the
    environment the demo runs in."""
    pieces, site = stage_dir / "pieces", stage_dir / "site"
    key = hashlib.sha256(json.dumps(manifest["pieces"]).encode()).hexdigest()[:16]
    installed = site / f".installed-{key}"
    if not installed.is_file():
        if site.exists():
            shutil.rmtree(site)
        wheels = [str(pieces / p["name"]) for p in manifest["pieces"] if p["kind"] == "wheel"]
        subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--disable-pip-version-check", "--target", str(site), *wheels], check=True)
        installed.write_text("\n".join(sorted(Path(w).name for w in wheels)) + "\n", encoding="utf-8")
    model = stage_dir / "model" / manifest["model"]
    if not model.is_file() or sha256(model) != manifest["model_sha256"]:
        model.parent.mkdir(parents=True, exist_ok=True)
        partial = model.with_suffix(".part")
        with open(partial, "wb") as sink:
            for piece in sorted((p for p in manifest["pieces"] if p["kind"] == "model"), key=lambda p: p["name"]):
                sink.write((pieces / piece["name"]).read_bytes())
        if sha256(partial) != manifest["model_sha256"]:
            raise SystemExit(f"gpu.column: the model put together from its pieces does not match {manifest['model']}")
        os.replace(partial, model)
    shared = stage_dir / "shared"
    for piece in (p for p in manifest["pieces"] if p["kind"] == "games"):
        with tarfile.open(pieces / piece["name"]) as archive:
            archive.extractall(shared / "alfworld", filter="data")
    environment = {"PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
                   "REFLECTRL_SHARED": str(shared)}
    return model, environment


def device(python: str, environment: dict[str, str]) -> str:
    """The accelerator the demo computes on, in words (torch's name for it, or the CPU's)."""
    probe = ("import torch, platform; print(torch.cuda.get_device_name(0) + f' (torch {torch.__version__})' "
             "if torch.cuda.is_available() else 'CPU: ' + (platform.processor() or platform.machine()) "
             "+ f' (torch {torch.__version__})')")
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, env={**os.environ, **environment})
    return done.stdout.strip() or f"unknown ({done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''})"


def run_demo(argv: list[str], python: str, environment: dict[str, str], log: Path) -> int:
    """``demo.py argv`` in its own process, its output both shown and kept in ``log``; its exit status."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as kept:
        process = subprocess.Popen([python, "demo.py", *argv], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, **environment, "PYTHONUNBUFFERED": "1"})
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            kept.write(line)
        return process.wait()


def column_folder(results: Path, column: str, seed: int) -> Path | None:
    """Where demo.py put the column's GPU profile (``<column>-gpu-<model>``: recipes/gpu.on_gpu names it): the one
    whose seed ran last."""
    found = sorted(results.glob(f"demo/{column}-gpu-*/seed-{seed}"), key=lambda path: path.stat().st_mtime)
    return found[-1].parent if found else None


def pack(column_dir: Path, seed: int, out: Path, facts: dict, log: Path) -> list[Path]:
    """What a seed of the column measured, in at most :data:`MAX_FILES` files under ``out``; their paths."""
    folder = column_dir / f"seed-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    header = "\n".join(f"* {name}: {value}" for name, value in facts.items())
    seed_table = folder / "results.md"
    body = seed_table.read_text(encoding="utf-8") if seed_table.is_file() else "(the seed did not finish)\n"
    written.append(_write(out / "results.md", f"{body}\n## This run\n\n{header}\n"))
    finished = folder / "finished.json"
    run = json.loads(finished.read_text(encoding="utf-8"))["run"] if finished.is_file() else None
    written.append(_write(out / "results.json", json.dumps({"facts": facts, "run": run}, indent=1) + "\n"))
    written.append(_write(out / "metrics.jsonl", joined(folder / "runs", "rl-*/*_rl_finetune/metrics.jsonl", "run",
                                                         newest_only=True)))
    written.append(_write(out / "episodes.jsonl", joined(folder / "runs", "evaluation*/*_evaluate/episodes.jsonl",
                                                         "evaluation")))
    tails = []
    for stage_log in sorted((folder / "logs").glob("*.log")):
        lines = stage_log.read_text(encoding="utf-8", errors="replace").splitlines()[-STAGE_LOG_LINES:]
        tails.append(f"==> {stage_log.name} (its last {len(lines)} lines)\n" + "\n".join(lines))
    demo_output = log.read_bytes()[-LOG_BYTES:].decode("utf-8", errors="replace") if log.is_file() else ""
    written.append(_write(out / "log.txt", f"==> demo.py's output\n{demo_output}\n" + "\n\n".join(tails) + "\n"))
    for figure in sorted(folder.glob("*.png"))[:MAX_FILES - len(written)]:
        shutil.copyfile(figure, out / figure.name)
        written.append(out / figure.name)
    for path in written:
        if path.stat().st_size > MAX_BYTES:
            raise SystemExit(f"gpu.column: {path} is {path.stat().st_size} bytes, over the {MAX_BYTES} that come back")
    return written


def joined(runs: Path, pattern: str, key: str, newest_only: bool = False) -> str:
    """The JSON lines of every file ``pattern`` finds under ``runs``, each record with ``key``: the stage folder it
    came from (``rl-reflect-rl``, ``evaluation-reflect-rl``). With ``newest_only``, of a stage's run folders only
    the newest is read: an RL stage that resumed (a window's end) carries its earlier iterations' records into its
    new run folder, which would count them twice."""
    found = sorted(runs.glob(pattern))
    if newest_only:  # a stage folder's run folders are <id>_<script>: the highest id is the newest
        newest = {stage: max((path.parent for path in found if path.parents[1] == stage), key=_run_id)
                  for stage in {path.parents[1] for path in found}}
        found = [path for path in found if path.parent == newest[path.parents[1]]]
    lines = []
    for path in found:
        lines += [json.dumps({key: path.parents[1].name, **json.loads(line)}) + "\n"
                  for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return "".join(lines)


def _run_id(run_dir: Path) -> int:
    """The number a run folder's name starts with (``utils.checkpoints.run_dirs``' order, without its imports)."""
    return int(run_dir.name.split("_", 1)[0])


def _write(path: Path, text: str) -> Path:
    """``text`` into ``path``; gzipped into ``path.gz`` where it would exceed what comes back (:data:`MAX_BYTES`: a
    whole column's episode records can)."""
    data = text.encode("utf-8")
    if len(data) > MAX_BYTES:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    return path


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python -m gpu.column", description=__doc__.split("\n\n")[0])
    cli.add_argument("--column", required=True, choices=COLUMNS)
    cli.add_argument("--seed", type=int, default=0)
    cli.add_argument("--bundle", help="the folder of gpu.bundle's parts (build/gpu-bundle), on a machine without "
                                      "the project's packages")
    cli.add_argument("--out", default=str(REPO_ROOT / "results" / "gpu"),
                     help="the folder the packed results go to (<out>/<column>-seed<N>/)")
    cli.add_argument("--results", default=str(REPO_ROOT / "results"), help="demo.py's --ckpt_path")
    cli.add_argument("--model_name", help="another model than the profile's (SmolLM2-135M-Instruct)")
    cli.add_argument("--smoke", action="store_true", help="--profile gpu-smoke: every stage at a few steps")
    options, extra = cli.parse_known_args(argv)
    python, environment, model = sys.executable, {}, options.model_name
    manifest = None
    if options.bundle:
        try:
            manifest = stage(Path(options.bundle), STAGE)
        except Missing as missing:
            print(f"gpu.column: {missing}", flush=True)
            return MISSING_PARTS
        if options.column == "alfworld" and manifest["column"] != "alfworld":
            raise SystemExit(f"gpu.column: the bundle was made for {manifest['column']}, without ALFWorld's packages "
                             "and games (make gpu-bundle COLUMN=alfworld)")
        staged_model, environment = set_up(manifest, STAGE, python)
        model = model or str(staged_model)
    demo_argv = ["--task", options.column, "--profile", "gpu-smoke" if options.smoke else "gpu",
                 "--seed", str(options.seed), f"--ckpt_path={options.results}",
                 *([f"--model_name={model}"] if model else []), *extra]
    out = Path(options.out) / f"{options.column}-seed{options.seed}"
    log = out.parent / f".{out.name}.log"  # the demo's whole output, beside what comes back
    tic = time.time()
    code = run_demo(demo_argv, python, environment, log)
    facts = {"command": f"python -m gpu.column --column {options.column} --seed {options.seed}"
                        + (" --smoke" if options.smoke else "") + (f" --model_name {options.model_name}" if
                                                                   options.model_name else ""),
             "demo": "python demo.py " + " ".join(demo_argv), "commit": (manifest or {}).get("commit") or _commit(),
             "device": device(python, environment), "exit status": code,
             "wall time of this call": f"{time.time() - tic:.0f} s"}
    folder = column_folder(Path(options.results), options.column, options.seed)
    if folder is None:
        print(f"gpu.column: demo.py made no seed-{options.seed} folder under {options.results}/demo (exit status {code})")
        return code or 1
    written = pack(folder, options.seed, out, facts, log)
    print(f"gpu.column: {len(written)} files in {out}: {', '.join(path.name for path in written)}", flush=True)
    return code


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown (no git here)"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
