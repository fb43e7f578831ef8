"""What the two API-model evaluations share: episodes, play, summary, files."""

import checkpoints
from data_gen.llm import make_client
from envs import env_kwargs, make_env
from evaluation.evaluate import save_results, summarise, test_episodes
from evaluation.gpt_agent import play


def run_gpt_evaluation(args, script: str) -> int:
    if args.api == "oracle":
        raise ValueError("--api: evaluating a model needs --api openai, azure or local (oracle is a data writer)")
    client = make_client(args)
    run_dir = checkpoints.make_run_dir(args, script)
    env = make_env(args.env, **env_kwargs(args, evaluation=True, run_dir=run_dir))
    try:
        starts = test_episodes(args, env)
        episodes, answers, unusable = play(client, env, args.env, starts, temperature=0.0)
    finally:
        env.close()
    name = f"{args.api}:{args.model}"
    results = [{"name": name, "levels": summarise(episodes), "answers": answers, "unusable_answers": unusable}]
    table = save_results(run_dir, results, f"{name} on {args.env}", f"\nunusable answers: {unusable} of {answers}\n")
    print(f"\n[{script}] {name} on {args.env}: {len(episodes)} episodes, {unusable} of {answers} answers "
          f"unusable; saved in {run_dir}\n\n{table}\n{client.usage.summary()}")
    return 0
