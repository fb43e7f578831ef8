"""The two-player rollout, shared by RL fine-tuning and evaluation: the frozen reflector writes, the policy picks.

* ``episodes.py``: the episode loop (:class:`TwoPlayerRollout`), a batch of episodes stepped together;
* ``reflector.py``: the reflector's batched generation and its caches (memo, shared prefix, drafts, packed weights);
* ``policy.py``: the policy's scoring pass (label log-probabilities) and the passes kept for the update;
* ``records.py``: what a rollout records (decisions, episodes, how an episode starts, the running totals).
"""

from rollout.episodes import TwoPlayerRollout
from rollout.policy import Choice, KeptPasses, PolicyScorer, cut_left, entropy_of, pad_left
from rollout.records import Decision, Episode, EpisodeStart, RolloutStats, state_digest
from rollout.reflector import ReflectionMemo, ReflectorGeneration

__all__ = ["Choice", "Decision", "Episode", "EpisodeStart", "KeptPasses", "PolicyScorer", "ReflectionMemo",
           "ReflectorGeneration", "RolloutStats", "TwoPlayerRollout", "cut_left", "entropy_of", "pad_left",
           "state_digest"]
