"""`make demo`: the main job, offline, on CPU.

Until the environment, data and training stages land, the demo runs what exists: it
builds the offline tiny-gpt2, loads it through the project's loader as a LoRA policy
with the shrunk label head, and scores the choice labels of one prompt.
"""

import sys
import time

import torch

import utils
from experiment_args import parse_args
from prompts import LABELS, policy_prompt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(["--model_name=tiny-gpt2", *(argv or [])], prog="demo.py")
    utils.set_seed(args.seed)
    start = time.time()
    model, tokenizer = utils.load_model_and_tokenizer(args, shrink_head=True)
    trainable, total = utils.count_parameters(model)
    print(f"[demo] loaded {args.model_name} from {utils.resolve_model_path(args.model_name)}")
    print(f"[demo] LoRA policy: {trainable:,} trainable of {total:,} parameters; "
          f"label head over {len(utils.label_head(model).token_ids)} labels")
    obs = "A toy state.\nThe actions you can take now is:\n0. move south\n1. move north\n"
    prompt = policy_prompt(obs, "The actions you can take now is:")
    batch = tokenizer([prompt], return_tensors="pt").to(utils.device())
    with torch.no_grad():
        logits = model(**batch, logits_to_keep=1).logits[0, -1, :2]
    probs = torch.softmax(logits, -1).tolist()
    print(f"[demo] untrained policy over labels {LABELS[:2]}: {[round(p, 3) for p in probs]}")
    print(f"[demo] done in {time.time() - start:.1f}s. The data, SFT, RL and evaluation stages are not "
          "implemented yet; they join this demo as their issues land.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
