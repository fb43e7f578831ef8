"""The frozen reflector's side of the two-player rollout: every reflection of a step in one batched, seeded
generation, with the caches that make it cheaper without changing what it writes (to rounding): the memo of
reflections by prompt (:class:`ReflectionMemo`), the prompts' shared prefix read once (``reflect_prefix``,
utils/kv_cache.py), drafted greedy decoding (``draft_tokens``, utils/draft_decoding.py) and the linear weights
packed for the CPU (``reflect_packed``, utils/packed_weights.py)."""

import contextlib

import torch
from transformers import DynamicCache, GenerationConfig

from prompts import clean_reflection
from rollout.policy import _device, cut_left, pad_left
from rollout.records import _clocked
from utils import lm_head
from utils.draft_decoding import draft_source, greedy_with_drafts
from utils.kv_cache import WeightsMemo


class ReflectionMemo(WeightsMemo):
    """The reflections a frozen reflector has written, by prompt: an exact cache where the same prompt always
    gives the same text (greedy reflections, ``--top_k 1``).

    Keyed on the prompt's token ids as the reflector reads them (cut to length), and valid only for the
    weights it was filled under: each tensor's version counter (bumped by every in-place change, such as an
    optimiser step) is compared at each use, and any change empties the memo. ``--no_reflection_memo``
    turns it off.
    """


class ReflectorGeneration:
    """The reflector's half of :class:`rollout.TwoPlayerRollout` (its base class): :meth:`reflect` and the generation
    behind it. It reads the state the rollout's constructor sets (``reflector``, ``reflect_tokenizer``, ``memo``,
    ``reflect_prefix``, ``reflect_packed``, ``draft_tokens``, ``static_cache``, the sampling settings) and adds to
    its ``stats``."""

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
        texts = self.memo.fresh()  # prompt ids -> its reflection
        keys = [tuple(x) for x in ids]
        missing = dict.fromkeys(key for key in keys if key not in texts)
        for key, hint in zip(keys, hints):
            if key in missing and missing[key] is None:
                missing[key] = hint
        self.stats.reflection_hits += len(keys) - len(missing)
        if missing:
            texts.update(zip(missing, self._generate([list(key) for key in missing], seed, list(missing.values()))))
        return [texts[key] for key in keys]

    def _generate(self, ids: list[list[int]], seed: int, hints: list[str | None]) -> list[str]:
        """One batched, seeded generation after each prompt's token ids (cut to length already): drafted
        (:func:`utils.draft_decoding.greedy_with_drafts`) where ``--draft_tokens`` says so, else ``generate``."""
        packed = self.reflect_packed.active() if self.reflect_packed else contextlib.nullcontext()
        with lm_head.full_head(self.reflector), packed:  # the packed layers include the full head
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
