"""The experiment runner behind ``demo.py``: :mod:`runner.stages` (stages side by side, resumable),
:mod:`runner.markers` (what a stage leaves to be kept or continued),
:mod:`runner.seed` (one training seed of a recipe: data, SFT, RL, evaluation, report) and :mod:`runner.report`
(the tables)."""
