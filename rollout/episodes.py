"""The two-player rollout's episode loop (:class:`TwoPlayerRollout`), shared by RL fine-tuning and evaluation.

``per_device_eval_batch_size`` episodes run in parallel. At each step, for the
environments still running:

1. the frozen **reflection model** writes every reflection in ONE batched
   ``generate`` (sampling, at most ``reflect_max_new_tokens`` new tokens, stopped at a
   newline or EOS and cut at any marker);
2. ONE batched forward pass of the **policy** over all policy prompts gives the
   next-token logits at the action marker — the policy never calls ``generate`` —
   restricted to the labels each environment shows; a label is sampled at the
   temperature, and its log-probability, the entropy and the prompt are kept.

Each running episode is a :class:`Slot` (its env, how it started, its decisions so far,
its current observation and reflection). An :class:`EpisodeStart` with ``replay`` replays
an earlier episode's prefix first: that is how REFUEL (``rl_algorithms/refuel.py``)
branches an episode at a chosen step.

Prompts come from ``prompts.py`` (the builder SFT data uses), left-padded, and cut from
the left at ``max_seq_length`` (counted in :attr:`RolloutStats.truncated`).

This file is the episode loop; the two players' internals and the records are beside it:
``reflector.py`` (the reflector's generation and its caches), ``policy.py`` (the policy's scoring)
and ``records.py`` (decisions, episodes, starts and the running totals).
"""

import contextlib
import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from envs.base import TextEnv
from prompts import policy_prompt, reflection_prompt
from rollout.policy import Choice, PolicyMemo, PolicyScorer, _device, entropy_of
from rollout.records import Decision, Episode, EpisodeStart, RolloutStats, _clocked, state_digest
from rollout.reflector import ReflectionMemo, ReflectorGeneration
from utils import log_filters, models
from utils.checkpoint_checks import CheckSettings, check_checkpoint
from utils.checkpoints import POLICY, REFLECTOR
from utils.errors import UsageError
from utils.kv_cache import PrefixKV
from utils.packed_weights import PackedWeights
from utils.packed_weights import available as packed_weights_available

logger = logging.getLogger(__name__)


class TwoPlayerRollout(ReflectorGeneration):
    def __init__(self, policy, tokenizer, *, reflector=None, reflect_tokenizer=None, reflect_prob: float = 1.0,
                 temperature: float = 1.0, max_seq_length: int = 1024, reflect_max_new_tokens: int = 100,
                 greedy: bool = False, top_p: float = 1.0, top_k: int = 0, reflect_one_line: bool = True,
                 mask_invalid: bool = True, reflection_memo: bool = True, prefix_cache: bool = True,
                 policy_memo: bool = False,
                 static_cache: bool = False, argmax_top1: bool = True, draft_tokens: int = 0,
                 packed_weights: bool = False, policy_answer: str = "label"):
        if policy_answer == "command" and not mask_invalid:
            raise UsageError("--policy_answer=command scores the commands a menu shows: it needs --mask_invalid")
        self.scorer = PolicyScorer(policy, tokenizer, max_seq_length, temperature, answer=policy_answer)
        self.reflector = reflector
        self.reflect_tokenizer = reflect_tokenizer or tokenizer
        self.reflect_prob = reflect_prob if reflector is not None else 0.0
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.max_new_tokens = reflect_max_new_tokens
        self.greedy = greedy
        # top-1 sampling decoded as the argmax it draws (the same token but for exact ties): --argmax_top1
        self.greedy_reflections = greedy or (argmax_top1 and top_k == 1)
        self.stats = RolloutStats()
        log_filters.silence_unpadded_generate_warning()
        self.one_line = reflect_one_line
        # False: every label of the alphabet may be chosen (the paper's code)
        self.mask_invalid = mask_invalid
        newline = self.reflect_tokenizer.encode("\n", add_special_tokens=False) if reflect_one_line else []
        self._stop_ids = [self.reflect_tokenizer.eos_token_id] + (newline if len(newline) == 1 else [])
        # Only where a prompt's reflection is a function of the prompt: greedy decoding.
        deterministic = greedy or top_k == 1
        self.memo = ReflectionMemo(reflector) if reflection_memo and deterministic and reflector is not None else None
        # The prompts' shared prefixes, read once per batch (utils/kv_cache.py)
        self.policy_prefix = PrefixKV(policy) if prefix_cache else None
        self.policy_memo = PolicyMemo(policy) if policy_memo else None  # choices without gradient only
        self.reflect_prefix = PrefixKV(reflector) if prefix_cache and reflector is not None else None
        self.static_cache = static_cache
        # greedy reflections check guessed tokens, up to this many a forward pass (utils/draft_decoding.py)
        self.draft_tokens = draft_tokens if self.greedy_reflections and not static_cache else 0
        self._last_text: str | None = None  # the latest reflection generated: the hint of a row that has none
        # the frozen reflector's linear weights laid out once for the CPU's products (utils/packed_weights.py)
        self.reflect_packed = (PackedWeights(reflector) if packed_weights and reflector is not None
                               and _device(reflector).type == "cpu" and packed_weights_available() else None)

    @property
    def labels(self) -> tuple[str, ...]:
        """The policy's choice labels: build the environments with them (``make_env(..., labels=...)``)."""
        return self.scorer.labels

    @classmethod
    def load(cls, args, policy_dir: str | None, reflect_dir: str | None, *, reflect: bool, trainable: bool = False,
             shrink_head: bool | None = None,
             flags: tuple[str, str] = ("--load_dir", "--reflect_load_dir")) -> "TwoPlayerRollout":
        """Load the two players as the flags describe (the one loader of RL, evaluation and the benchmarks):
        the policy from ``policy_dir`` (trainable or frozen; with the label head when ``shrink_head``,
        default ``--shrink_head``) and, when ``reflect``, the frozen reflector from ``reflect_dir``
        (``--reflect_model_name``; without a folder, the untuned base model, with a warning).

        Each folder is checked first (``utils.checkpoint_checks.check_checkpoint``: a checkpoint of the player
        it is loaded as, fit for this run's settings); a bad one stops the run with one line naming its
        ``flags`` entry (where it came from: ``--load_dir``, ``--resume_from``, an evaluation entry).
        What the checks and the loader read of ``args`` is taken from it here, once for both players."""
        checks, loader = CheckSettings.from_args(args), models.ModelSettings.from_args(args)
        if policy_dir is not None:
            check_checkpoint(checks, policy_dir, POLICY, flags[0])
        if reflect and reflect_dir is not None:
            check_checkpoint(checks, reflect_dir, REFLECTOR, flags[1])
        shrink_head = args.shrink_head if shrink_head is None else shrink_head
        policy, tokenizer = models.load_model_and_tokenizer(loader, adapter_dir=policy_dir, trainable=trainable,
                                                           shrink_head=shrink_head)
        policy.eval()  # no dropout: the log-probs of an update equal those of the rollout
        reflector, reflect_tokenizer = None, None
        if reflect:
            if reflect_dir is None:
                logger.warning("--reflect without --reflect_load_dir: reflections come from the untuned base model")
            reflector, reflect_tokenizer = models.load_model_and_tokenizer(
                loader, model_name=args.reflect_model_name, adapter_dir=reflect_dir, trainable=False)
        return cls.from_args(args, policy, tokenizer, reflector, reflect_tokenizer)

    @classmethod
    def from_args(cls, args, policy, tokenizer, reflector=None, reflect_tokenizer=None) -> "TwoPlayerRollout":
        """The rollout the flags describe (the same for RL, evaluation and the benchmarks)."""
        return cls(policy, tokenizer, reflector=reflector, reflect_tokenizer=reflect_tokenizer,
                   reflect_prob=args.reflect_prob, temperature=args.temperature, max_seq_length=args.max_seq_length,
                   reflect_max_new_tokens=args.reflect_max_new_tokens, top_p=args.top_p, top_k=args.top_k,
                   reflect_one_line=args.reflect_one_line, mask_invalid=args.mask_invalid,
                   reflection_memo=args.reflection_memo, prefix_cache=args.prefix_cache, policy_memo=args.policy_memo,
                   static_cache=args.static_cache, argmax_top1=args.argmax_top1, draft_tokens=args.draft_tokens,
                   packed_weights=args.packed_weights, policy_answer=args.policy_answer)

    # --- the policy player (the reflector's: rollout.reflector.ReflectorGeneration) --------

    @_clocked("policy_seconds")
    @torch.no_grad()
    def act(self, prompts: list[str], valid: list[list[int]], generator: torch.Generator,
            keep: bool = False) -> list[Choice]:
        """One sampled (or greedy) label per prompt, from one batched forward pass; with ``keep``, the pass
        runs with gradient and each choice carries its row of label log-probs with the graph (the prompts are
        then read whole: a prefix read without gradient would cut the graph)."""
        if not prompts:
            return []
        rows = [None] * len(prompts)
        self.stats.decisions += len(prompts)
        if keep:
            with torch.enable_grad():  # the rows too: a view taken under no_grad would not reach the graph
                scores = self.scorer.logprobs(prompts, valid)
                rows = list(scores.logprobs.unbind(0))
            logp = scores.logprobs.detach().cpu()
        elif self.policy_memo is not None:
            logp, hits, scores = self.policy_memo.lookup(
                prompts, valid, lambda texts, labels: self.scorer.logprobs(texts, labels, prefix=self.policy_prefix))
            self.stats.policy_hits += hits
        else:
            scores = self.scorer.logprobs(prompts, valid, prefix=self.policy_prefix)
            logp = scores.logprobs.detach().cpu()
        if scores is not None:
            self.stats.truncated += scores.truncated
            self.stats.policy_tokens += scores.tokens
        if self.greedy:
            actions = logp.argmax(-1)
        else:
            actions = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        entropies = entropy_of(logp)
        return [Choice(int(a), float(logp[i, a]), float(entropies[i]), rows[i]) for i, a in enumerate(actions)]

    # --- episodes ---------------------------------------------------------------------------

    def run(self, envs: list[TextEnv], starts: list[EpisodeStart], rng: np.random.Generator,
            keep_passes: bool = False) -> list[Episode]:
        """Play one episode per env from ``starts``; all randomness comes from ``rng``. ``keep_passes``
        (``--reuse_rollout_pass``, training rollouts): keep the policy's forward passes with their graphs in
        ``scorer.kept``, for the update (:class:`KeptPasses`); the passes kept before are dropped."""
        if len(envs) != len(starts):
            raise ValueError(f"{len(envs)} envs but {len(starts)} episode starts")
        for env in envs:
            if env.label_set != self.labels:
                raise ValueError(f"an environment shows the labels {env.label_set[:12]}..., the policy reads "
                                 f"{self.labels[:12]}...: build it with make_env(..., labels=rollout.labels)")
        self.stats.episodes += len(starts)
        if keep_passes:
            self.scorer.kept.clear()
        with _pool(envs) as pool:
            return self._run(envs, starts, rng, pool, keep_passes)

    def _run(self, envs: list[TextEnv], starts: list[EpisodeStart], rng: np.random.Generator,
             pool: ThreadPoolExecutor | None, keep_passes: bool = False) -> list[Episode]:
        slots = _each(pool, lambda pair: Slot.begin(*pair), list(zip(envs, starts)))
        running = slots
        while running:
            step_seed = int(rng.integers(2**31 - 1))
            generator = torch.Generator().manual_seed(step_seed)
            for slot in running:
                slot.check_replay()
            free = [slot for slot in running if not slot.replaying]
            self._reflect(free, rng, step_seed)
            prompts = [policy_prompt(slot.obs, slot.env.action_head, slot.reflection, self.one_line,
                                     slot.env.instruction(slot.env.text_layout), slot.env.text_layout) for slot in free]
            if self.mask_invalid:
                valid = [[self.scorer.label_index[label] for label in slot.info["labels"]] for slot in free]
            else:
                valid = [list(range(len(self.labels)))] * len(free)  # one list, never changed
            choices = self.act(prompts, valid, generator, keep_passes)
            for slot, prompt, labels, choice in zip(free, prompts, valid, choices):
                slot.decide(prompt, labels, choice)
                if choice.row is not None:
                    self.scorer.kept.keep(slot.episode.decisions[-1], choice.row)
            _each(pool, Slot.play, running)
            running = [slot for slot in running if not slot.done]
        return [slot.episode for slot in slots]

    def _reflect(self, slots: list["Slot"], rng: np.random.Generator, seed: int) -> None:
        """Set each slot's reflection for this step: reused at a branch step, asked for with
        probability ``reflect_prob`` (all asked at once), or none."""
        ask = []
        for slot in slots:
            if slot.at_branch:
                slot.reflection = slot.start.replay[-1].reflection  # the branch step sees the original one
            elif self.reflector is not None and rng.random() < self.reflect_prob:
                ask.append(slot)
            else:
                slot.reflection = None
        # each slot's reflection of its previous step (still set): the hint its next one is drafted from
        texts = self.reflect([reflection_prompt(s.obs, s.env.action_head, s.env.instruction(s.env.text_layout),
                                                s.env.text_layout) for s in ask], seed, [s.reflection for s in ask])
        for slot, text in zip(ask, texts):
            slot.reflection = text


def _pool(envs: list[TextEnv]):
    """Threads to wait on several environments at once, where their games run in other processes (an
    ALFWorld reset or step is spent in its worker); none otherwise."""
    if len(envs) > 1 and any(env.plays_elsewhere for env in envs):
        return ThreadPoolExecutor(max_workers=len(envs), thread_name_prefix="env")
    return contextlib.nullcontext()


def _each(pool: ThreadPoolExecutor | None, work, items: list) -> list:
    """``work`` on every item, in order: on the pool's threads if there is one (each env used by one
    thread; results and errors as if done one after the other)."""
    return list(pool.map(work, items)) if pool is not None else [work(item) for item in items]


@dataclass(eq=False)  # slots are compared by identity
class Slot:
    """One running episode: its env, how it started, what it has decided, where it stands."""

    env: TextEnv
    start: EpisodeStart
    episode: Episode
    obs: str
    info: dict
    reflection: str | None = None  # the reflection shown at the current step
    done: bool = False

    @classmethod
    def begin(cls, env: TextEnv, start: EpisodeStart) -> "Slot":
        obs, info = env.reset(seed=start.seed, options=start.options)
        episode = Episode(seed=start.seed, options=start.options, level=start.level, group=start.group)
        return cls(env, start, episode, obs, info)

    @property
    def step(self) -> int:
        return len(self.episode.decisions)

    @property
    def replaying(self) -> bool:
        """Still in the replayed prefix of a branch (before its branch step)."""
        return self.start.branch_step is not None and self.step < self.start.branch_step

    @property
    def at_branch(self) -> bool:
        return self.step == self.start.branch_step

    def check_replay(self) -> None:
        branch = self.start.branch_step
        if branch is not None and self.step <= branch and self.start.replay[self.step].obs != self.obs:
            raise RuntimeError(f"replay of the episode with seed {self.start.seed} diverged at step {self.step}: "
                               "the environment did not reproduce the recorded state")

    def decide(self, prompt: str, valid: list[int], choice: Choice) -> None:
        oracle = self.info.get("oracle_label")
        self.episode.decisions.append(Decision(
            obs=self.obs, prompt=prompt, valid=valid, action=choice.action, logprob=choice.logprob,
            entropy=choice.entropy, reflection=self.reflection,
            oracle=None if oracle is None else self.env.label_set.index(oracle), state=state_digest(self.info)))

    def play(self) -> None:
        """Play this step's decision: the recorded one while in a branch's replayed prefix."""
        if self.replaying:
            self.replay_decision()
        self.advance()

    def replay_decision(self) -> None:
        self.episode.decisions.append(dataclasses.replace(self.start.replay[self.step]))

    def advance(self) -> None:
        """Play the last decision's label in the env."""
        decision = self.episode.decisions[-1]
        self.obs, reward, terminated, truncated, self.info = self.env.step(self.env.label_set[decision.action])
        decision.reward = float(reward)
        if terminated or truncated:
            self.done = True
            self.episode.success = bool(self.info["success"])
            self.episode.cost = float(self.info["cost"])
