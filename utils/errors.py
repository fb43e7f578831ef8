"""``UsageError``: bad input — a flag, a file, a model that does not fit. The entry points
(:func:`experiment_args.run_script`) print it as one line and exit with status 2; any other
exception keeps its traceback, because it is a bug to fix here, not an input to fix there."""


class UsageError(ValueError):
    """Raised with a one-line message that names the flag, file, model or value at fault."""
