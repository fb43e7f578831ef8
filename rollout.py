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

Each running episode is a :class:`Slot` (its env, how it started, its decisions so far,
its current observation and reflection). An :class:`EpisodeStart` with ``replay`` replays
an earlier episode's prefix first: that is how REFUEL (``rl_algorithms/refuel.py``)
branches an episode at a chosen step.

Prompts come from ``prompts.py`` (the builder SFT data uses), left-padded, and cut from
the left at ``max_seq_length`` (counted in :attr:`RolloutStats.truncated`).
"""

import contextlib
import dataclasses
import functools
import hashlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from transformers import DynamicCache, GenerationConfig

from envs.base import TextEnv
from prompts import clean_reflection, label_alphabet, label_token_ids, policy_prompt, reflection_prompt
from utils import checkpoints, models
from utils.draft_decoding import DraftStats, draft_source, greedy_with_drafts
from utils.kv_cache import PrefixKV, WeightsWatch
from utils.packed_weights import PackedWeights
from utils.packed_weights import available as packed_weights_available

logger = logging.getLogger(__name__)


@dataclass
class Decision:
    """One policy step: what it saw, what it could pick, what it picked."""

    obs: str
    prompt: str
    valid: list[int]  # indices into the policy's label alphabet of the labels shown
    action: int  # index into the policy's label alphabet of the label chosen
    logprob: float  # log-probability of ``action`` under the behaviour policy, at the temperature
    entropy: float
    reflection: str | None = None
    reward: float = 0.0
    oracle: int | None = None
    state: str | None = None  # a digest of the environment's state key (``info["state_key"]``): equal states, equal keys


@dataclass
class Episode:
    seed: int
    options: dict
    level: str = ""
    decisions: list[Decision] = field(default_factory=list)
    success: bool = False
    cost: float = 0.0
    group: int | None = None  # episodes of one batch with the same group played the same start (--group_size)

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
    group: int | None = None  # the batch's starts played more than once share one (``--group_size``)

    @property
    def branch_step(self) -> int | None:
        return len(self.replay) - 1 if self.replay else None


@dataclass
class RolloutStats:
    """Running totals of one rollout object (per process)."""

    policy_tokens: int = 0
    reflection_prompt_tokens: int = 0
    reflection_new_tokens: int = 0
    truncated: int = 0  # prompts cut from the left at max_seq_length
    episodes: int = 0  # episodes played, a learner's extra ones (REFUEL's branches) included
    decisions: int = 0
    reflections: int = 0  # reflections asked for
    reflection_hits: int = 0  # of those, answered from the memo (ReflectionMemo) without generating
    drafts: DraftStats = field(default_factory=DraftStats)  # guessed reflection tokens (--draft_tokens)
    # wall-clock seconds in the two players' calls: where a rollout's time goes (RL's metrics, benchmarks)
    reflect_seconds: float = 0.0  # TwoPlayerRollout.reflect: the reflector's generation, memo look-ups included
    policy_seconds: float = 0.0  # TwoPlayerRollout.act: the policy's scoring pass (with gradient where kept)

    @property
    def reflection_hit_rate(self) -> float:
        return self.reflection_hits / self.reflections if self.reflections else 0.0

    @property
    def prompt_tokens(self) -> int:
        """Tokens of every prompt the two players read."""
        return self.policy_tokens + self.reflection_prompt_tokens


def _clocked(name: str):
    """Add a method's wall-clock seconds to ``self.stats.<name>`` (a :class:`RolloutStats` field)."""

    def wrap(method):
        @functools.wraps(method)
        def timed(self, *args, **kwargs):
            tic = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                setattr(self.stats, name, getattr(self.stats, name) + time.perf_counter() - tic)

        return timed

    return wrap


class Choice(NamedTuple):
    """The policy's pick at one step."""

    action: int  # index into the policy's label alphabet
    logprob: float  # at the temperature
    entropy: float  # of the distribution over the valid labels
    row: torch.Tensor | None = None  # the label log-probs with their graph, where the pass is kept for the update


class KeptPasses:
    """The policy's forward passes of the latest training rollout, kept with their autograd graphs so that the
    update reads each decision's label log-probs from them instead of reading its prompt again
    (``--reuse_rollout_pass``).

    Valid only at the weights they were computed with: each parameter's version counter is compared when the
    update takes them, and any in-place change since (an optimiser step, weights swapped in) drops them all.
    A backward pass frees a graph for every row of its forward pass, so they are taken once, in one piece:
    the leading run of the given decisions that has kept rows; whatever else was kept is dropped.
    """

    def __init__(self, policy):
        self.watch = WeightsWatch(policy)
        self.rows: dict[int, tuple[Decision, torch.Tensor]] = {}  # id(decision) -> (decision, its row)

    def clear(self) -> None:
        """Forget every kept pass (a new training rollout begins at the current weights)."""
        self.rows.clear()
        self.watch.changed()

    def keep(self, decision: "Decision", row: torch.Tensor) -> None:
        self.rows[id(decision)] = (decision, row)

    def take(self, decisions: list["Decision"]) -> list[torch.Tensor]:
        """The kept rows of the leading decisions that have one (none if the weights changed since), consumed."""
        if not self.rows:
            return []
        taken = []
        if not self.watch.changed():
            for decision in decisions:
                entry = self.rows.get(id(decision))
                if entry is None or entry[0] is not decision:
                    break
                taken.append(entry[1])
        self.rows.clear()
        return taken


@dataclass
class LabelScores:
    """What one batched policy forward pass gives."""

    logprobs: torch.Tensor  # (B, len(labels)) log-probabilities at the temperature, -inf outside the valid labels
    hidden: torch.Tensor | None  # (B, hidden) last hidden state at the action marker, if asked for
    truncated: int  # prompts cut from the left at max_seq_length
    tokens: int  # prompt tokens read


@dataclass
class Encoded:
    """A left-padded batch of prompts (see :func:`pad_left`)."""

    inputs: dict[str, torch.Tensor]  # input_ids, attention_mask, position_ids
    truncated: int
    tokens: int


class PolicyScorer:
    """Log-probabilities of the choice labels after policy prompts (with or without gradient).

    The labels are the tokenizer's alphabet (:func:`prompts.label_alphabet`); ``label_index``
    maps a label to its column.
    """

    def __init__(self, policy, tokenizer, max_seq_length: int, temperature: float):
        self.policy, self.tokenizer = policy, tokenizer
        self.max_seq_length, self.temperature = max_seq_length, temperature
        self.labels = label_alphabet(tokenizer)
        self.label_index = {label: i for i, label in enumerate(self.labels)}
        self.label_ids = torch.tensor(label_token_ids(tokenizer, self.labels))
        self.kept = KeptPasses(policy)  # the training rollout's passes, for the update (--reuse_rollout_pass)

    def logprobs(self, prompts: list[str], valid: list[list[int]], with_hidden: bool = False,
                 prefix: PrefixKV | None = None) -> LabelScores:
        """Label log-probabilities after each prompt, only ``valid[i]`` allowed for prompt i; the prompts'
        shared prefix read once through ``prefix`` where given (no gradient: the rollout's choices)."""
        ids, truncated = cut_left(self.tokenizer, prompts, self.max_seq_length)
        device = _device(self.policy)
        prepared = prefix.prepare(ids, self.tokenizer.pad_token_id, device) if prefix is not None else None
        if prepared is None:
            encoded = pad_left(self.tokenizer, ids, truncated, device)
            out = self.policy(**encoded.inputs, logits_to_keep=1, output_hidden_states=with_hidden)
            tokens = encoded.tokens
        else:
            out = self.policy(input_ids=prepared.input_ids[:, prepared.prefix:], attention_mask=prepared.attention_mask,
                              position_ids=prepared.position_ids, cache=prepared.cache, use_cache=True,
                              logits_to_keep=1, output_hidden_states=with_hidden)
            tokens = prepared.tokens
        logits = out.logits[:, -1, :].float()
        if models.label_head(self.policy) is None:
            logits = logits[:, self.label_ids.to(logits.device)]
        mask = torch.zeros_like(logits, dtype=torch.bool)
        for row, indices in enumerate(valid):
            mask[row, indices] = True
        logp = torch.log_softmax((logits / self.temperature).masked_fill(~mask, float("-inf")), dim=-1)
        hidden = out.hidden_states[-1][:, -1, :].float() if with_hidden else None
        return LabelScores(logp, hidden, truncated, tokens)


def _device(model) -> torch.device:
    return next(model.parameters()).device


def cut_left(tokenizer, prompts: list[str], max_length: int) -> tuple[list[list[int]], int]:
    """Each prompt's token ids cut from the left at ``max_length``, and how many were cut."""
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    return [x[-max_length:] for x in ids], sum(len(x) > max_length for x in ids)


def pad_left(tokenizer, ids: list[list[int]], truncated: int, device) -> Encoded:
    """Token ids (already cut to length) as a left-padded batch."""
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    # Left padding must not shift positions: each prompt's first real token is position 0.
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    batch = {"input_ids": input_ids, "attention_mask": attention, "position_ids": positions}
    return Encoded({k: v.to(device) for k, v in batch.items()}, truncated, int(attention.sum()))


def entropy_of(logp: torch.Tensor) -> torch.Tensor:
    probs = logp.exp()
    return -(probs * logp.masked_fill(probs == 0, 0.0)).sum(-1)


class ReflectionMemo:
    """The reflections a frozen reflector has written, by prompt: an exact cache where the same prompt always
    gives the same text (greedy reflections, ``--top_k 1``).

    Keyed on the prompt's token ids as the reflector reads them (cut to length), and valid only for the
    weights it was filled under: each tensor's version counter (bumped by every in-place change, such as an
    optimiser step) is compared at each use, and any change empties the memo. ``--no_reflection_memo``
    turns it off.
    """

    def __init__(self, reflector):
        self.texts: dict[tuple[int, ...], str] = {}
        self.watch = WeightsWatch(reflector)

    def check(self) -> None:
        """Forget everything if the reflector's weights changed since the memo was filled."""
        if self.watch.changed():
            self.texts.clear()


class TwoPlayerRollout:
    def __init__(self, policy, tokenizer, *, reflector=None, reflect_tokenizer=None, reflect_prob: float = 1.0,
                 temperature: float = 1.0, max_seq_length: int = 1024, reflect_max_new_tokens: int = 100,
                 greedy: bool = False, top_p: float = 1.0, top_k: int = 0, reflect_one_line: bool = True,
                 mask_invalid: bool = True, reflection_memo: bool = True, prefix_cache: bool = True,
                 static_cache: bool = False, argmax_top1: bool = True, draft_tokens: int = 0,
                 packed_weights: bool = False):
        self.scorer = PolicyScorer(policy, tokenizer, max_seq_length, temperature)
        self.reflector = reflector
        self.reflect_tokenizer = reflect_tokenizer or tokenizer
        self.reflect_prob = reflect_prob if reflector is not None else 0.0
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.max_new_tokens = reflect_max_new_tokens
        self.greedy = greedy
        # top-1 sampling decoded as the argmax it draws (the same token but for exact ties): --argmax_top1
        self.greedy_reflections = greedy or (argmax_top1 and top_k == 1)
        self.stats = RolloutStats()
        models.silence_unpadded_generate_warning()
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

        Each folder is checked first (``checkpoints.check_checkpoint``: a checkpoint of the player it is
        loaded as, fit for this run's settings); a bad one stops the run with one line naming its
        ``flags`` entry (where it came from: ``--load_dir``, ``--resume_from``, an evaluation entry)."""
        if policy_dir is not None:
            checkpoints.check_checkpoint(args, policy_dir, checkpoints.POLICY, flags[0])
        if reflect and reflect_dir is not None:
            checkpoints.check_checkpoint(args, reflect_dir, checkpoints.REFLECTOR, flags[1])
        shrink_head = args.shrink_head if shrink_head is None else shrink_head
        policy, tokenizer = models.load_model_and_tokenizer(args, adapter_dir=policy_dir, trainable=trainable,
                                                           shrink_head=shrink_head)
        policy.eval()  # no dropout: the log-probs of an update equal those of the rollout
        reflector, reflect_tokenizer = None, None
        if reflect:
            if reflect_dir is None:
                logger.warning("--reflect without --reflect_load_dir: reflections come from the untuned base model")
            reflector, reflect_tokenizer = models.load_model_and_tokenizer(
                args, model_name=args.reflect_model_name, adapter_dir=reflect_dir, trainable=False)
        return cls.from_args(args, policy, tokenizer, reflector, reflect_tokenizer)

    @classmethod
    def from_args(cls, args, policy, tokenizer, reflector=None, reflect_tokenizer=None) -> "TwoPlayerRollout":
        """The rollout the flags describe (the same for RL, evaluation and the benchmarks)."""
        return cls(policy, tokenizer, reflector=reflector, reflect_tokenizer=reflect_tokenizer,
                   reflect_prob=args.reflect_prob, temperature=args.temperature, max_seq_length=args.max_seq_length,
                   reflect_max_new_tokens=args.reflect_max_new_tokens, top_p=args.top_p, top_k=args.top_k,
                   reflect_one_line=args.reflect_one_line, mask_invalid=args.mask_invalid,
                   reflection_memo=args.reflection_memo, prefix_cache=args.prefix_cache,
                   static_cache=args.static_cache, argmax_top1=args.argmax_top1, draft_tokens=args.draft_tokens,
                   packed_weights=args.packed_weights)

    # --- the two players ----------------------------------------------------------------

    @_clocked("reflect_seconds")
    @torch.no_grad()
    def reflect(self, prompts: list[str], seed: int, hints: list[str | None] | None = None) -> list[str]:
        """Reflections for ``prompts`` in one batched, seeded generation; those the memo holds
        (:class:`ReflectionMemo`) are not generated again. ``hints``: per prompt, a text its reflection may
        resemble (the same episode's previous reflection), where drafted decoding looks for its guesses; they
        change how fast a reflection is written, not what it says (but for rounding, utils/draft_decoding.py)."""
        if not prompts:
            return []
        ids, truncated = cut_left(self.reflect_tokenizer, prompts, self.scorer.max_seq_length - self.max_new_tokens)
        hints = hints or [None] * len(prompts)
        self.stats.truncated += truncated
        self.stats.reflections += len(prompts)
        if self.memo is None:
            return self._generate(ids, seed, hints)
        self.memo.check()
        keys = [tuple(x) for x in ids]
        missing = dict.fromkeys(key for key in keys if key not in self.memo.texts)
        for key, hint in zip(keys, hints):
            if key in missing and missing[key] is None:
                missing[key] = hint
        self.stats.reflection_hits += len(keys) - len(missing)
        if missing:
            self.memo.texts.update(zip(missing, self._generate([list(key) for key in missing], seed,
                                                               list(missing.values()))))
        return [self.memo.texts[key] for key in keys]

    def _generate(self, ids: list[list[int]], seed: int, hints: list[str | None]) -> list[str]:
        """One batched, seeded generation after each prompt's token ids (cut to length already): drafted
        (:func:`utils.draft_decoding.greedy_with_drafts`) where ``--draft_tokens`` says so, else ``generate``."""
        packed = self.reflect_packed.active() if self.reflect_packed else contextlib.nullcontext()
        with models.full_head(self.reflector), packed:  # the packed layers include the full head
            return self._generate_now(ids, seed, hints)

    def _generate_now(self, ids: list[list[int]], seed: int, hints: list[str | None]) -> list[str]:
        """:meth:`_generate` with the reflector's full head (and its packed weights) in place."""
        pad_id = self.reflect_tokenizer.pad_token_id
        device = _device(self.reflector)
        static_len = max(map(len, ids)) + self.max_new_tokens if self.static_cache else None
        prepared = self.reflect_prefix.prepare(ids, pad_id, device, static_len=static_len) if self.reflect_prefix else None
        if prepared is None:
            encoded = pad_left(self.reflect_tokenizer, ids, 0, device)
            inputs, tokens, cache = dict(encoded.inputs), encoded.tokens, None
        else:
            inputs = {"input_ids": prepared.input_ids, "attention_mask": prepared.attention_mask,
                      "position_ids": prepared.position_ids}
            tokens, cache = prepared.tokens, prepared.cache
        self.stats.reflection_prompt_tokens += tokens
        if self.draft_tokens:
            new = self._drafted(ids, inputs, cache, hints, prepared.prefix if prepared else 0)
        else:
            new = self._generated(inputs, cache, seed, device)
        self.stats.reflection_new_tokens += sum(len([t for t in row if t != pad_id]) for row in new)
        texts = [clean_reflection(text, self.one_line)
                 for text in self.reflect_tokenizer.batch_decode(new, skip_special_tokens=True)]
        self._last_text = texts[0]
        return texts

    def _generated(self, inputs: dict, cache, seed: int, device) -> list[list[int]]:
        """The new tokens of transformers' ``generate`` (seeded), padded after a row's stop."""
        sample = not self.greedy_reflections
        config = GenerationConfig(
            do_sample=sample, temperature=self.temperature if sample else None,
            top_k=self.top_k if sample else None, top_p=self.top_p if sample else None,
            max_new_tokens=self.max_new_tokens, eos_token_id=self._stop_ids,
            pad_token_id=self.reflect_tokenizer.pad_token_id)
        batch = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
        if cache is not None:
            batch["cache"] = cache
        elif self.static_cache:
            config.cache_implementation = "static"
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            out = self.reflector.generate(**batch, generation_config=config)  # positions counted from the mask
        return out[:, batch["input_ids"].shape[1]:].tolist()

    def _drafted(self, ids: list[list[int]], inputs: dict, cache, hints: list[str | None], prefix: int) -> list[list[int]]:
        """The new tokens of greedy decoding with drafts looked up in each row's hint (its own, else the
        latest reflection generated) and its text so far."""
        texts = [hint or self._last_text or "" for hint in hints]
        hint_ids = self.reflect_tokenizer(texts, add_special_tokens=False)["input_ids"]  # one call for the batch
        sources = [draft_source(row, hint) for row, hint in zip(ids, hint_ids)]
        return greedy_with_drafts(
            self.reflector, input_ids=inputs["input_ids"][:, prefix:], attention_mask=inputs["attention_mask"],
            position_ids=inputs["position_ids"], cache=cache if cache is not None else DynamicCache(config=self.reflector.config),
            sources=sources, max_new_tokens=self.max_new_tokens, stop_ids=self._stop_ids,
            draft_tokens=self.draft_tokens, pad_id=self.reflect_tokenizer.pad_token_id, stats=self.stats.drafts)

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
        if keep:
            with torch.enable_grad():  # the rows too: a view taken under no_grad would not reach the graph
                scores = self.scorer.logprobs(prompts, valid)
                rows = list(scores.logprobs.unbind(0))
        else:
            scores = self.scorer.logprobs(prompts, valid, prefix=self.policy_prefix)
        self.stats.truncated += scores.truncated
        self.stats.policy_tokens += scores.tokens
        self.stats.decisions += len(prompts)
        logp = scores.logprobs.detach().cpu()
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


def state_digest(info: dict) -> str | None:
    """A short digest of the environment's state key (``info["state_key"]``), None where it gives none."""
    key = info.get("state_key")
    return None if key is None else hashlib.blake2b(key.encode("utf-8"), digest_size=8).hexdigest()


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
