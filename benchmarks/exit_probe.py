"""Runs a script as ``__main__`` and, when its interpreter exits, prints the names of the process's threads:

    python benchmarks/exit_probe.py SCRIPT.py [ARGS ...]

what ``benchmarks/two_process_exit.py`` and the two-process test launch in place of ``rl_finetune.py``, to see
whether a rank still ran gloo's threads at its exit (``utils/distributed.py``). Standard library only, and no
import of this checkout: it also runs another checkout's script (``--repo``).
"""

import atexit
import os
import runpy
import sys

MARK = "[exit_probe]"


def thread_names() -> list[str]:
    names = []
    for task in sorted(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else []:
        try:
            with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as comm:
                names.append(comm.read().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return names


def say() -> None:
    print(f"{MARK} rank {os.environ.get('RANK', '0')} threads at exit: {','.join(thread_names())}", file=sys.stderr,
          flush=True)


if __name__ == "__main__":
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    atexit.register(say)
    runpy.run_path(script, run_name="__main__")
