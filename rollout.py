"""The two-player rollout, shared by RL fine-tuning and evaluation.

``per_device_eval_batch_size`` episodes run in parallel. At each step, for the
environments still running:

1. the frozen **reflection model** writes every reflection in ONE batched
   ``generate`` (sampling, at most ``reflect_max_new_tokens`` new tokens, stopped at a
   newline or EOS and cut at any marker);
2. ONE batched forward pass of the **policy** over all policy prompts gives the
   next-token logits at the action marker — the policy never calls ``generate`` —
   restricted to the labels each environment shows; a label is sampled at the
   temperature, and its log-probability, the entropy and the prompt are kept.

Prompts come from ``prompts.py`` (the builder SFT data uses), left-padded, and cut from
the left at ``max_seq_length`` (counted in :attr:`RolloutStats.truncated`).
"""

import dataclasses
import logging
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import GenerationConfig

import models
from envs.base import TextEnv
from prompts import LABELS, clean_reflection, label_token_ids, policy_prompt, reflection_prompt


class _UnpaddedGenerateWarning(logging.Filter):
    """Drop transformers' "strongly recommend passing in an `attention_mask`" line for our ``generate``.

    We always pass the mask. When a batch needs no padding, ``generate`` drops the all-ones mask
    itself, and once a row has finished it is filled with the pad (= eos) token, which makes
    GPT-2 warn although nothing attends to padding.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "passing in an `attention_mask`" not in record.getMessage()


logging.getLogger("transformers.modeling_utils").addFilter(_UnpaddedGenerateWarning())

LABEL_INDEX = {label: i for i, label in enumerate(LABELS)}


@dataclass
class Decision:
    """One policy step: what it saw, what it could pick, what it picked."""

    obs: str
    prompt: str
    valid: list[int]  # indices into prompts.LABELS of the labels shown
    action: int  # index into prompts.LABELS of the label chosen
    logprob: float  # log-probability of ``action`` under the behaviour policy, at the temperature
    entropy: float
    reflection: str | None = None
    reward: float = 0.0
    oracle: int | None = None


@dataclass
class Episode:
    seed: int
    options: dict
    level: str = ""
    decisions: list[Decision] = field(default_factory=list)
    success: bool = False
    cost: float = 0.0

    def costs(self) -> list[float]:
        return [-d.reward for d in self.decisions]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Episode":
        data = dict(data)
        data["decisions"] = [Decision(**d) for d in data["decisions"]]
        return cls(**data)


@dataclass
class EpisodeStart:
    """How to start an episode: the reset seed and options.

    For a REFUEL branch, ``replay`` holds an earlier episode's decisions up to and
    including the branch step h: steps before h are replayed as recorded (their
    states checked), and at step h the recorded state and reflection are reused but
    a fresh action is sampled.
    """

    seed: int
    options: dict
    level: str = ""
    replay: list[Decision] = field(default_factory=list)

    @property
    def branch_step(self) -> int | None:
        return len(self.replay) - 1 if self.replay else None


@dataclass
class RolloutStats:
    policy_tokens: int = 0
    reflection_prompt_tokens: int = 0
    reflection_new_tokens: int = 0
    truncated: int = 0
    decisions: int = 0

    def add(self, other: "RolloutStats") -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class PolicyScorer:
    """Log-probabilities of the choice labels after policy prompts (with or without gradient)."""

    def __init__(self, policy, tokenizer, max_seq_length: int, temperature: float):
        self.policy, self.tokenizer = policy, tokenizer
        self.max_seq_length, self.temperature = max_seq_length, temperature
        self.label_ids = torch.tensor(label_token_ids(tokenizer))

    def logprobs(self, prompts: list[str], valid: list[list[int]], with_hidden: bool = False):
        """``(B, len(LABELS))`` log-probabilities (-inf outside ``valid``); plus stats and hidden states."""
        batch, truncated, tokens = encode_left(self.tokenizer, prompts, self.max_seq_length, _device(self.policy))
        out = self.policy(**batch, logits_to_keep=1, output_hidden_states=with_hidden)
        logits = out.logits[:, -1, :].float()
        if models.label_head(self.policy) is None:
            logits = logits[:, self.label_ids.to(logits.device)]
        mask = torch.zeros_like(logits, dtype=torch.bool)
        for row, indices in enumerate(valid):
            mask[row, indices] = True
        logp = torch.log_softmax((logits / self.temperature).masked_fill(~mask, float("-inf")), dim=-1)
        hidden = out.hidden_states[-1][:, -1, :].float() if with_hidden else None
        return logp, hidden, truncated, tokens


def _device(model) -> torch.device:
    return next(model.parameters()).device


def encode_left(tokenizer, prompts: list[str], max_length: int, device) -> tuple[dict, int, int]:
    """Left-padded batch, each prompt cut from the left at ``max_length``; also (#truncated, #tokens)."""
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    truncated = sum(len(x) > max_length for x in ids)
    ids = [x[-max_length:] for x in ids]
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    # Left padding must not shift positions: each prompt's first real token is position 0.
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    batch = {"input_ids": input_ids, "attention_mask": attention, "position_ids": positions}
    return {k: v.to(device) for k, v in batch.items()}, truncated, int(attention.sum())


def entropy_of(logp: torch.Tensor) -> torch.Tensor:
    probs = logp.exp()
    return -(probs * logp.masked_fill(probs == 0, 0.0)).sum(-1)


class TwoPlayerRollout:
    def __init__(self, policy, tokenizer, *, reflector=None, reflect_tokenizer=None, reflect_prob: float = 1.0,
                 temperature: float = 1.0, max_seq_length: int = 1024, reflect_max_new_tokens: int = 100,
                 greedy: bool = False):
        self.scorer = PolicyScorer(policy, tokenizer, max_seq_length, temperature)
        self.reflector = reflector
        self.reflect_tokenizer = reflect_tokenizer or tokenizer
        self.reflect_prob = reflect_prob if reflector is not None else 0.0
        self.temperature = temperature
        self.max_new_tokens = reflect_max_new_tokens
        self.greedy = greedy
        self.stats = RolloutStats()
        newline = self.reflect_tokenizer.encode("\n", add_special_tokens=False)
        self._stop_ids = [self.reflect_tokenizer.eos_token_id] + (newline if len(newline) == 1 else [])

    @classmethod
    def from_args(cls, args, policy, tokenizer, reflector=None, reflect_tokenizer=None) -> "TwoPlayerRollout":
        """The rollout the flags describe (the same for RL, evaluation and the benchmarks)."""
        return cls(policy, tokenizer, reflector=reflector, reflect_tokenizer=reflect_tokenizer,
                   reflect_prob=args.reflect_prob, temperature=args.temperature, max_seq_length=args.max_seq_length,
                   reflect_max_new_tokens=args.reflect_max_new_tokens)

    # --- the two players ----------------------------------------------------------------

    @torch.no_grad()
    def reflect(self, prompts: list[str], seed: int) -> list[str]:
        """Reflections for ``prompts`` in one batched, seeded ``generate``."""
        if not prompts:
            return []
        batch, truncated, tokens = encode_left(self.reflect_tokenizer, prompts,
                                               self.scorer.max_seq_length - self.max_new_tokens,
                                               _device(self.reflector))
        config = GenerationConfig(
            do_sample=not self.greedy, temperature=self.temperature if not self.greedy else None,
            top_k=0 if not self.greedy else None, top_p=1.0 if not self.greedy else None,
            max_new_tokens=self.max_new_tokens, eos_token_id=self._stop_ids,
            pad_token_id=self.reflect_tokenizer.pad_token_id)
        devices = [batch["input_ids"].device] if batch["input_ids"].is_cuda else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            with models.full_head(self.reflector):
                out = self.reflector.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                              generation_config=config)
        new = out[:, batch["input_ids"].shape[1]:]
        self.stats.truncated += truncated
        self.stats.reflection_prompt_tokens += tokens
        self.stats.reflection_new_tokens += int((new != self.reflect_tokenizer.pad_token_id).sum())
        texts = self.reflect_tokenizer.batch_decode(new, skip_special_tokens=True)
        return [clean_reflection(text) for text in texts]

    @torch.no_grad()
    def act(self, prompts: list[str], valid: list[list[int]], generator: torch.Generator) -> list[tuple[int, float, float]]:
        """(label index, log-prob, entropy) per prompt, from one batched forward pass."""
        if not prompts:
            return []
        logp, _, truncated, tokens = self.scorer.logprobs(prompts, valid)
        self.stats.truncated += truncated
        self.stats.policy_tokens += tokens
        self.stats.decisions += len(prompts)
        logp = logp.cpu()
        if self.greedy:
            actions = logp.argmax(-1)
        else:
            actions = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        entropies = entropy_of(logp)
        return [(int(a), float(logp[i, a]), float(entropies[i])) for i, a in enumerate(actions)]

    # --- episodes ---------------------------------------------------------------------------

    def run(self, envs: list[TextEnv], starts: list[EpisodeStart], rng: np.random.Generator) -> list[Episode]:
        """Play one episode per env from ``starts``; all randomness comes from ``rng``."""
        if len(envs) != len(starts):
            raise ValueError(f"{len(envs)} envs but {len(starts)} episode starts")
        episodes, observations, infos = [], [], []
        for env, start in zip(envs, starts):
            obs, info = env.reset(seed=start.seed, options=start.options)
            episodes.append(Episode(seed=start.seed, options=start.options, level=start.level))
            observations.append(obs)
            infos.append(info)
        running = list(range(len(envs)))
        while running:
            step_seed = int(rng.integers(2**31 - 1))
            generator = torch.Generator().manual_seed(step_seed)
            forced = [i for i in running if _replaying(starts[i], episodes[i])]
            free = [i for i in running if i not in forced]
            for i in running:
                _check_replay(starts[i], episodes[i], observations[i])
            reflections = self._reflections(envs, starts, episodes, observations, free, rng, step_seed)
            prompts = [policy_prompt(observations[i], envs[i].action_head, reflections[i]) for i in free]
            valid = {i: [LABEL_INDEX[label] for label in infos[i]["labels"]] for i in free}
            chosen = dict(zip(free, self.act(prompts, [valid[i] for i in free], generator)))
            for i, prompt in zip(free, prompts):
                self._record(episodes[i], observations[i], prompt, valid[i], chosen[i], reflections[i], infos[i])
            for i in forced:
                replayed = starts[i].replay[len(episodes[i].decisions)]
                episodes[i].decisions.append(dataclasses.replace(replayed))
                chosen[i] = (replayed.action, replayed.logprob, replayed.entropy)
            still = []
            for i in running:
                obs, reward, terminated, truncated, info = envs[i].step(LABELS[chosen[i][0]])
                episodes[i].decisions[-1].reward = float(reward)
                observations[i], infos[i] = obs, info
                if terminated or truncated:
                    episodes[i].success = bool(info["success"])
                    episodes[i].cost = float(info["cost"])
                else:
                    still.append(i)
            running = still
        return episodes

    def _reflections(self, envs, starts, episodes, observations, free, rng, seed) -> dict[int, str | None]:
        out: dict[int, str | None] = {}
        ask = []
        for i in free:
            if len(episodes[i].decisions) == starts[i].branch_step:
                out[i] = starts[i].replay[-1].reflection  # the branch step sees the original reflection
            elif self.reflector is not None and rng.random() < self.reflect_prob:
                ask.append(i)
            else:
                out[i] = None
        texts = self.reflect([reflection_prompt(observations[i], envs[i].action_head, envs[i].analyze_instruction)
                              for i in ask], seed)
        out.update(zip(ask, texts))
        return out

    @staticmethod
    def _record(episode, obs, prompt, valid, chosen, reflection, info) -> None:
        action, logprob, entropy = chosen
        oracle = info.get("oracle_label")
        episode.decisions.append(Decision(
            obs=obs, prompt=prompt, valid=valid, action=action, logprob=logprob, entropy=entropy,
            reflection=reflection, oracle=None if oracle is None else LABEL_INDEX[oracle]))


def _replaying(start: EpisodeStart, episode: Episode) -> bool:
    """Whether the episode is still in the replayed prefix (before the branch step)."""
    return start.branch_step is not None and len(episode.decisions) < start.branch_step


def _check_replay(start: EpisodeStart, episode: Episode, obs: str) -> None:
    step = len(episode.decisions)
    if start.branch_step is not None and step <= start.branch_step and start.replay[step].obs != obs:
        raise RuntimeError(f"replay of the episode with seed {start.seed} diverged at step {step}: "
                           "the environment did not reproduce the recorded state")


class SayCanScorer:
    """The baseline the paper compares against: score every action's text by its likelihood.

    For a state prompt ``s`` and actions ``a_1..a_n``, the score of ``a_i`` is
    ``log p(a_i | s)`` summed over its tokens. Uncached, that is n forward passes over
    ``s + a_i``; with ``cache=True`` the state is encoded once and its key/value cache is
    shared by all actions (one batched pass over the action tokens). Single-prompt
    enumeration (:class:`PolicyScorer`) needs one pass over ``s`` plus the listed actions.
    """

    def __init__(self, model, tokenizer, cache: bool = True):
        self.model, self.tokenizer, self.cache = model, tokenizer, cache
        self.tokens = 0  # tokens passed through the model, for the cost comparison

    @torch.no_grad()
    def scores(self, state: str, actions: list[str]) -> torch.Tensor:
        device = _device(self.model)
        state_ids = self.tokenizer(state, add_special_tokens=False)["input_ids"]
        action_ids = [self.tokenizer(a, add_special_tokens=False)["input_ids"] for a in actions]
        if not self.cache:
            out = []
            for ids in action_ids:
                full = torch.tensor([state_ids + ids], device=device)
                logits = self.model(full, attention_mask=torch.ones_like(full)).logits
                logp = torch.log_softmax(logits[0, len(state_ids) - 1:-1].float(), -1)
                out.append(logp.gather(1, torch.tensor(ids, device=device).unsqueeze(1)).sum())
                self.tokens += full.shape[1]
            return torch.stack(out)
        state = torch.tensor([state_ids], device=device)
        prefix = self.model(state, attention_mask=torch.ones_like(state), use_cache=True)
        self.tokens += len(state_ids)
        width = max(map(len, action_ids))
        pad = self.tokenizer.pad_token_id
        batch = torch.tensor([ids + [pad] * (width - len(ids)) for ids in action_ids], device=device)
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in action_ids], device=device)
        cache = prefix.past_key_values
        cache.batch_repeat_interleave(len(actions))
        attention = torch.cat([torch.ones(len(actions), len(state_ids), dtype=mask.dtype, device=device), mask], 1)
        positions = torch.arange(len(state_ids), len(state_ids) + width, device=device).expand(len(actions), -1)
        logits = self.model(batch, past_key_values=cache, attention_mask=attention, position_ids=positions).logits
        self.tokens += int(mask.sum())
        # The first action token is predicted by the state's last position.
        first = torch.log_softmax(prefix.logits[0, -1].float(), -1)[batch[:, 0]]
        rest = torch.log_softmax(logits[:, :-1].float(), -1).gather(2, batch[:, 1:].unsqueeze(-1)).squeeze(-1)
        return first + (rest * mask[:, 1:]).sum(-1)
