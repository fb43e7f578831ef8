"""The RL learners, one file each, behind one interface (:class:`Learner`).

``--trainer NAME`` picks ``LEARNERS[NAME]``, built with its settings:
``LEARNERS[name](LearnerSettings.from_args(args), scorer, accelerator)``. To add a learner, write a
``Learner`` subclass in a new file here and add one line to ``LEARNERS`` (and its flags to
``LearnerSettings``).

Nothing here is imported until it is used (PEP 562): the flags check ``--trainer`` against ``LEARNERS``'s names
only, so a command that trains nothing (``envs.play``, the data generators) starts without torch.
"""

import importlib
from collections.abc import Iterator, MutableMapping


class _Registry(MutableMapping):
    """Learner name -> class, a class named by its place ("module:Class") imported the first time it is asked
    for. A class can be set directly too (``LEARNERS["mine"] = MyLearner``)."""

    def __init__(self, places: dict[str, str]):
        self._entries: dict[str, str | type] = dict(places)

    def __getitem__(self, name: str) -> type:
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, cls = entry.partition(":")
            entry = self._entries[name] = getattr(importlib.import_module(module), cls)
        return entry

    def __setitem__(self, name: str, learner: type) -> None:
        self._entries[name] = learner

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __contains__(self, name: object) -> bool:  # the name alone (Mapping's own would import the class)
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


_PLACES = {
    "pg": "rl_algorithms.pg:PolicyGradient",  # REINFORCE with replay (the paper)
    "ppo": "rl_algorithms.ppo:PPO",
    "refuel": "rl_algorithms.refuel:Refuel",
    "rloo": "rl_algorithms.rloo:RLOO",  # the group learners: --group_size 2 or more
    "grpo": "rl_algorithms.grpo:GRPO",
    "gigpo": "rl_algorithms.gigpo:GiGPO",
}
LEARNERS: MutableMapping[str, type] = _Registry(_PLACES)

# The package's names, each imported from its module on first use: the learners above, and these
_OTHERS = {"base": ("Learner", "LearnerSettings", "Play", "UpdateResult", "flat_decisions"),
           "replay": ("ReplayBuffer",), "refuel": ("refuel_pairs",),
           "losses": ("ValueHead", "cost_to_go", "pg_loss", "ppo_loss", "refuel_loss", "value_loss")}
_HOME = {**{cls: module for module, _, cls in (place.partition(":") for place in _PLACES.values())},
         **{name: f"rl_algorithms.{module}" for module, names in _OTHERS.items() for name in names}}
__all__ = ["LEARNERS", *sorted(_HOME)]


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'rl_algorithms' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
