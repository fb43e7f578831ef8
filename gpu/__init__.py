"""A column's GPU run in a borrowed window (``make gpu-bundle``, ``make gpu-column``).

* :mod:`gpu.bundle` (here, where pip reaches PyPI): what a GPU machine without this project's packages, its model or
  its game files needs, from the lock, in parts small enough to travel one per call.
* :mod:`gpu.column` (there, on the machine's own Python with torch): the parts put together, the column run
  (``demo.py --profile gpu``), and what it measured packed into one small folder.
"""
