"""The RL learners, one file each, behind one interface (:class:`Learner`).

``--trainer NAME`` picks ``LEARNERS[NAME]``, built with its settings:
``LEARNERS[name](LearnerSettings.from_args(args), scorer, accelerator)``. To add a learner, write a
``Learner`` subclass in a new file here and add one line to ``LEARNERS`` (and its flags to
``LearnerSettings``).
"""

from rl_algorithms.base import Learner, LearnerSettings, Play, UpdateResult, flat_decisions
from rl_algorithms.gigpo import GiGPO
from rl_algorithms.grpo import GRPO
from rl_algorithms.losses import ValueHead, cost_to_go, pg_loss, ppo_loss, refuel_loss, value_loss
from rl_algorithms.pg import PolicyGradient, ReplayBuffer
from rl_algorithms.ppo import PPO
from rl_algorithms.refuel import Refuel, refuel_pairs
from rl_algorithms.rloo import RLOO

LEARNERS: dict[str, type[Learner]] = {
    "pg": PolicyGradient,  # REINFORCE with replay (the paper)
    "ppo": PPO,
    "refuel": Refuel,
    "rloo": RLOO,  # the group learners: --group_size 2 or more
    "grpo": GRPO,
    "gigpo": GiGPO,
}

__all__ = ["GRPO", "LEARNERS", "PPO", "RLOO", "GiGPO", "Learner", "LearnerSettings", "Play", "PolicyGradient", "Refuel",
           "ReplayBuffer", "UpdateResult", "ValueHead", "cost_to_go", "flat_decisions", "pg_loss", "ppo_loss",
           "refuel_loss", "refuel_pairs", "value_loss"]
