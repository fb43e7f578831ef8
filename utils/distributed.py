"""The process group of a run under ``accelerate launch``: made and torn down so that every rank exits 0.

Some torch modules take the world group as a default argument when they are imported
(``torch.distributed.fsdp``'s ``ShardedGradScaler``, which transformers' modeling code imports;
``torch.distributed.nn``; ``torch.distributed.optim``). Imported after the group exists, they hold it for the
rest of the process: ``destroy_process_group`` then frees nothing, gloo's threads (``gloo_tcp_loop``,
``pt_gloo_runloop``) run on into the interpreter's exit, and a rank now and then aborts there (``terminate called
without an active exception``, SIGABRT, after its work is done: 1 of 248 runs beside other work on two cores,
and four suite runs turned red; ``benchmarks/two_process_exit.py``). So :func:`start` imports them before it makes
the group, and :func:`end` tears it down on every rank and says so if a gloo thread outlives it.
"""

import importlib
import logging
import os

logger = logging.getLogger(__name__)

# Modules that hold the world group once imported after it was made (a default argument), the model code that
# imports one of them among them; imported before the group, they hold None.
HOLD_THE_GROUP = ("torch.distributed.fsdp", "torch.distributed.nn", "torch.distributed.optim",
                  "transformers.modeling_utils")
GLOO_THREADS = ("gloo_tcp_loop", "pt_gloo_runloop")


def start():
    """The run's ``Accelerator`` (its process group, under ``accelerate launch``), made once the modules that would
    hold the group are imported."""
    import torch
    from accelerate import Accelerator

    for name in HOLD_THE_GROUP:
        importlib.import_module(name)
    return Accelerator(cpu=not torch.cuda.is_available())


def end(accelerator) -> list[str]:
    """Every rank waits for the others (rank 0's last checkpoint), then destroys the process group; returns the gloo
    threads still running, which are warned of (the group is still held: see the module's docstring)."""
    accelerator.wait_for_everyone()
    accelerator.end_training()
    left = collective_threads()
    if left:
        logger.warning("%d gloo threads still run after the process group was destroyed (%s): a module imported "
                       "after the group was made holds it (utils/distributed.py); this rank may abort at exit",
                       len(left), ", ".join(sorted(set(left))))
    return left


def collective_threads() -> list[str]:
    """The names of this process's gloo threads (Linux: ``/proc/self/task``; elsewhere none are seen)."""
    names = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as comm:
                name = comm.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name in GLOO_THREADS:
            names.append(name)
    return names
