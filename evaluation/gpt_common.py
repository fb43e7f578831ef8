"""What the two API-model evaluations share: episodes, play, summary, files."""

import checkpoints
from envs import env_kwargs, make_env
from evaluation.evaluate import save_results, summarise, test_episodes
from evaluation.gpt_agent import play
from llm import make_client


def run_gpt_evaluation(args, script: str, reps: int) -> int:
    """Play the test episodes (``reps`` per task or level) with the model behind ``--api``; save the results."""
    if args.api == "oracle":
        raise ValueError("--api: evaluating a model needs --api openai, azure or local (oracle is a data writer)")
    client = make_client(args)
    run_dir = checkpoints.make_run_dir(args, script)
    env = make_env(args.env, **env_kwargs(args, evaluation=True, run_dir=run_dir))
    try:
        starts = test_episodes(args, env, reps)
        played = play(client, env, args.env, starts, temperature=0.0)
    finally:
        env.close()
    name = f"{args.api}:{args.model}"
    results = [{"name": name, "levels": summarise(played.episodes), "answers": played.answers,
                "unusable_answers": played.unusable}]
    unusable = f"{played.unusable} of {played.answers}"
    table = save_results(run_dir, results, f"{name} on {args.env}", f"\nunusable answers: {unusable}\n")
    print(f"\n[{script}] {name} on {args.env}: {len(played.episodes)} episodes, {unusable} answers "
          f"unusable; saved in {run_dir}\n\n{table}\n{client.usage.summary()}")
    return 0
