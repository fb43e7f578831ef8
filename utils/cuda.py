"""Whether torch will see a GPU (CUDA or ROCm): :func:`cuda_available`, answered where it can be without importing
torch, from the installed torch's build and the CUDA driver, so that a command that trains nothing starts without
torch's import."""

import ctypes
import importlib.util
import runpy
import sys
from pathlib import Path


def cuda_available() -> bool:
    """Whether torch sees a CUDA (or ROCm) device. Importing torch to ask takes 2.5 s (5 s with a GPU's
    start), so a command that trains nothing (``envs.play``, an oracle's or an API's data) first asks what
    answers without it: the installed torch's build and the CUDA driver (:func:`_gpu_without_torch`)."""
    if "torch" not in sys.modules:
        known = _gpu_without_torch()
        if known is not None:
            return known
    import torch

    return torch.cuda.is_available()


def _gpu_without_torch() -> bool | None:
    """Whether torch will see a GPU, as far as it is known without importing torch; None: torch must be asked.
    The installed torch's ``version.py`` (plain assignments) names its build: one with no CUDA nor HIP version
    sees no GPU. A CUDA build sees one when the driver (``libcuda``, which honours ``CUDA_VISIBLE_DEVICES`` as
    torch does) shows a device and runs that build's CUDA major version or a later one, and none when the
    driver is missing or shows no device. A ROCm build, an older driver, or a ``version.py`` that cannot be
    read leave it to torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        build = runpy.run_path(str(Path(spec.submodule_search_locations[0]) / "version.py"))
    except (OSError, SyntaxError, ImportError):
        return None
    if build.get("hip"):
        return None
    if not build.get("cuda"):
        return False
    devices, driver_cuda = _cuda_driver()
    if devices == 0:
        return False
    try:
        needed = int(str(build["cuda"]).split(".")[0]) * 1000
    except ValueError:
        return None
    return True if driver_cuda >= needed else None


def _cuda_driver() -> tuple[int, int]:
    """How many devices the CUDA driver shows this process, and the CUDA version it runs (13000 for 13.0);
    (0, 0) when its library is missing or fails to start."""
    try:
        driver = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
    except OSError:
        return 0, 0
    count, version = ctypes.c_int(0), ctypes.c_int(0)
    if (driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0
            or driver.cuDriverGetVersion(ctypes.byref(version)) != 0):
        return 0, 0
    return count.value, version.value
