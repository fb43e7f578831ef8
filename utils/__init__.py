"""What every script shares and is not the method itself.

errors (UsageError), paths (the repository's folders), seeding, metrics (the metric logger),
io (atomic writes, JSON and JSONL), checkpoints (run folders and checkpoints: the only save/load
path), models (THE model loader; model_paths: where a --model_name is found; lm_head: the label head;
log_filters: other libraries' loggers said once), tiny_gpt2 (the offline tiny model), llm (the one LLM client;
llm_reply: reading what the server sent back), arg_groups, arg_groups_model and arg_groups_io (the flags, one
dataclass per purpose, composed by ``experiment_args.ScriptArguments``), arg_fields (how a flag is declared and
checked), arg_words (reading settings files and the command line's words, and their errors), gpu (whether torch
will see a GPU) and parity (where this project departs from the paper's code, and ``--preset paper``).
"""
