"""DangerousTaxi: gymnasium's Taxi (Taxi-v4, deterministic) as a text game with a deadly rule.

The MDP is gymnasium's own; this module only renders it as text and changes the rewards:

* **dangerous rule**: an action that leaves the state unchanged (driving into a wall,
  an illegal pickup or drop-off) gives -10 and ends the episode. The paper's code misses it on
  the first step, where such a move costs gymnasium's own reward and the episode goes on
  (``danger_on_first_step=False``);
* **pickup reward**: in the ``pickup`` and ``full`` curriculum levels the first successful
  pickup's reward *is* +20 (``pickup_reward="replace"``, the paper's environment), or +20 on
  top of the step's -1 (``"add"``, this project's earlier rule), once;
* every reward is divided by 20.

Stages (the ``curriculum`` reset option): the three levels of ``--taxi_curriculum`` --
``pickup`` ends at the pickup; ``dropoff`` starts with the passenger in the taxi (the oracle
drives there first); ``full`` is the whole task with the pickup bonus -- and ``plain``, the
whole task with gymnasium's rewards and no bonus: what the paper's code plays without a
curriculum. A curriculum level succeeds when its total cost (-return) is below the level's
threshold (the paper's); ``plain`` succeeds when the passenger is delivered, since the paper's
threshold there (cost < -1) cannot be reached without the bonus.

``first_step`` (the paper's contextual bandit): the episode is one decision, scored by that
step's reward. ``oracle_completion`` (this project's): after the policy's first decision the
oracle plays the rest and the whole return is that decision's reward; ``success`` then says
whether the decision was optimal (the return equals the oracle's own) and the task got solved,
not merely whether it got solved, as a played-out episode almost always is.
"""

import copy
import functools
from collections import deque

import gymnasium

from envs.base import Outcome, TextEnv, rng_seed
from envs.curriculum import Curriculum, Level, proportional_steps, single_level
from envs.spec import EnvSettings, EnvSpec

ACTION_NAMES = ("Move south", "Move north", "Move east", "Move west", "Pickup passenger", "Drop off passenger")
PICKUP, DROPOFF = 4, 5
IN_TAXI = 4
FULL = "full"  # the whole task; the other curricula are its two halves
CURRICULA = ("pickup", "dropoff", FULL)  # in training order; --curriculum_index counts from 0
PLAIN = "plain"  # the whole task without a curriculum: no pickup bonus (the paper's code)
STAGES = CURRICULA + (PLAIN,)
DEPOTS = ("R", "G", "Y", "B")  # gymnasium's locs order
SUCCESS_COST_BELOW = {"pickup": 0.0, "dropoff": 0.0, FULL: -1.0}  # the paper's thresholds (PLAIN: delivered)
REWARD_SCALE = 20.0
DANGER_REWARD = -10.0
MOVE_REWARD = -1.0  # gymnasium's reward of a move (before scaling): what a wasted step costs
PICKUP_BONUS = 20.0
PICKUP_REWARDS = ("replace", "add")  # the first pickup's reward is the bonus, or the bonus plus the step's

RULES_MAP = """\
You are driving a taxi in a 5x5 grid city (the map below; '|' is a wall, ':' is open road).
"""
RULES_DEPOTS = "The four depots are R (top left), G (top right), Y (bottom left) and B (bottom).\n"
RULES = """\
In the map, T is the taxi, P the waiting passenger, D the destination, O the taxi on the
passenger's cell, and X the taxi with the passenger inside.
Your job: drive to the passenger, pick the passenger up, drive to the destination and drop
the passenger off. Each move costs a little; delivering the passenger earns a big reward.
Danger: driving into a wall, picking up where there is no passenger, or dropping off where
you may not ends the game at once with a big penalty.
"""


@functools.cache
def _gymnasium_taxi() -> gymnasium.Env:
    """gymnasium's deterministic Taxi, built once per process: its constructor spends about 20 ms on the
    transition table ``P`` (500 states x 6 actions), which is never written, so every environment shares
    it through a shallow copy; the state, last action and RNG are each copy's own from its first seeded
    reset (``_reset`` always seeds it)."""
    return gymnasium.make("Taxi-v4", is_rainy=False, fickle_passenger=False).unwrapped


def curriculum_at(index: int | None) -> str:
    """The stage ``--curriculum_index`` names; without one, the paper's task without a curriculum."""
    return PLAIN if index is None else CURRICULA[index]


class DangerousTaxiEnv(TextEnv):
    analyze_instruction = (
        "Find the taxi, the passenger and the destination on the map, judge the last move, "
        "and say which direction to go next.\n"
    )
    default_horizon = 20
    paper_instructs = True

    def __init__(self, horizon: int | None = None, shuffle_action: bool = False, curriculum: str = PLAIN,
                 with_prompt: bool = False, with_history: bool = False, first_step: bool = False,
                 render_mode: str | None = None, labels=None, pickup_reward: str = "replace",
                 oracle_completion: bool = False, danger_on_first_step: bool = True, depot_letters: bool = True,
                 text_layout: str = "ours"):
        if curriculum not in STAGES:
            raise ValueError(f"curriculum must be one of {STAGES}, got {curriculum!r}")
        if pickup_reward not in PICKUP_REWARDS:
            raise ValueError(f"pickup_reward must be one of {PICKUP_REWARDS}, got {pickup_reward!r}")
        self.pickup_reward = pickup_reward
        self.curriculum = curriculum
        self.with_prompt = with_prompt
        self.with_history = with_history
        self.danger_on_first_step = danger_on_first_step
        self.depot_letters = depot_letters
        self._taxi = copy.copy(_gymnasium_taxi())  # its own state, the process's transition table
        super().__init__(horizon=horizon, shuffle_action=shuffle_action, render_mode=render_mode, labels=labels,
                         text_layout=text_layout, first_step=first_step, oracle_completion=oracle_completion)
        self.state = 0
        self._history: list[tuple[str, str]] = []
        self._initial_grid = ""
        self._bonus_paid = False
        self._stage = curriculum

    def __deepcopy__(self, memo: dict) -> "DangerousTaxiEnv":
        """A copy that shares gymnasium's transition table (never written; ~97% of a full copy's cost),
        for searches over copies (``data_gen.taxi.brute_force``)."""
        memo[id(self._taxi.P)] = self._taxi.P
        clone = self.__class__.__new__(self.__class__)
        memo[id(self)] = clone
        clone.__dict__.update({name: copy.deepcopy(value, memo) for name, value in self.__dict__.items()})
        return clone

    def max_actions(self) -> int:
        return len(ACTION_NAMES)

    # --- episode start -----------------------------------------------------------------

    def _reset(self, options: dict) -> None:
        self._stage = options.get("curriculum", self.curriculum)
        if self._stage not in STAGES:
            raise ValueError(f"options['curriculum'] must be one of {STAGES}, got {self._stage!r}")
        state, _ = self._taxi.reset(seed=rng_seed(self.np_random))
        if self._stage == "dropoff":
            for action in shortest_plan(self._taxi, state, goal="pickup"):
                state = self._transition(state, action)[0]
        self.state = int(state)
        self._history = []
        self._bonus_paid = False
        self._delivered = False
        self._initial_grid = self._grid(self.state)

    # --- the step ------------------------------------------------------------------------

    def _act(self, index: int) -> Outcome:
        return self._apply(index)

    def _oracle_return(self) -> float:
        """The return of the oracle's plan from here, played on a copy."""
        probe = copy.deepcopy(self)
        plan = shortest_plan(probe._taxi, probe.state, probe._goal())
        if not plan:
            return float("-inf")  # no known optimum: any decision counts as optimal
        return sum(probe._apply(action).reward for action in plan)

    def _play_oracle_out(self, outcome: Outcome) -> None:
        for action in shortest_plan(self._taxi, self.state, self._goal()):
            outcome.reward += self._apply(action).reward

    def _apply(self, action: int) -> Outcome:
        before = self.state
        after, reward, delivered = self._transition(before, action)
        info = {}
        if after == before and (self.danger_on_first_step or self.steps > 1):
            reward, terminated = DANGER_REWARD, True
            info["danger"] = True
        else:
            picked_up = action == PICKUP and _passenger(self._taxi, after) == IN_TAXI
            self._delivered = self._delivered or delivered
            if picked_up and self._stage in ("pickup", FULL) and not self._bonus_paid:
                reward = PICKUP_BONUS + (reward if self.pickup_reward == "add" else 0.0)
                self._bonus_paid = True
            terminated = delivered or (self._stage == "pickup" and picked_up)
        self.state = after
        self._history.append((ACTION_NAMES[action], self._grid(after)))
        return Outcome(reward=reward / REWARD_SCALE, terminated=terminated, info=info)

    def _transition(self, state: int, action: int) -> tuple[int, float, bool]:
        ((_, after, reward, terminated),) = self._taxi.P[state][action]
        return int(after), float(reward), bool(terminated)

    def _goal(self) -> str:
        return "pickup" if self._stage == "pickup" else "deliver"

    # --- text --------------------------------------------------------------------------

    def _grid(self, state: int) -> str:
        return render_grid(self._taxi, state, self.depot_letters)

    def _state_text(self) -> str:
        rules = RULES_MAP + (RULES_DEPOTS if self.depot_letters else "") + RULES
        parts = [rules] if self.with_prompt else []
        if self.with_history:
            parts.append("--- Initial State ---\n" + self._initial_grid)
            for step, (name, grid) in enumerate(self._history, 1):
                parts.append(f"--- Step {step}: {name} ---\n{grid}")
        elif self.text_layout == "paper":  # the paper's structure: a lead line, then one action name per line
            parts.append("--- History ---\nActions taken so far, in order:\n"
                         + "".join(f"{name}\n" for name, _ in self._history))
        else:
            names = ", ".join(name for name, _ in self._history) or "none"
            parts.append(f"--- History ---\nPrevious actions: {names}\n")
        parts.append("--- Current State ---\n" + self._grid(self.state))
        return "".join(parts)

    def _action_texts(self) -> list[str]:
        return list(ACTION_NAMES)

    def _state_key(self) -> str:
        """The decoded state (taxi, passenger, destination) and what the episode still pays for: the stage and
        whether the pickup bonus was paid. The history in the text is left out."""
        row, col, passenger, destination = self._taxi.decode(self.state)
        return f"{self._stage}: taxi {row},{col} passenger {passenger} destination {destination} bonus {self._bonus_paid}"

    def _oracle_index(self) -> int | None:
        plan = shortest_plan(self._taxi, self.state, self._goal())
        return plan[0] if plan else None

    def _solved(self, total_reward: float) -> bool:
        if self._stage == PLAIN:
            return self._delivered
        return -total_reward < SUCCESS_COST_BELOW[self._stage]

    def _wasted_step_reward(self) -> float:
        return MOVE_REWARD / REWARD_SCALE

    def positions(self) -> dict:
        """Where things are: taxi cell, passenger depot (None when inside), destination depot."""
        row, col, passenger, destination = self._taxi.decode(self.state)
        return {
            "taxi": (int(row), int(col)),
            "passenger": None if passenger == IN_TAXI else DEPOTS[passenger],
            "destination": DEPOTS[destination],
            "depot_cells": dict(zip(DEPOTS, map(tuple, self._taxi.locs))),
        }

    @property
    def stage(self) -> str:
        """The curriculum of the current episode."""
        return self._stage


def _passenger(taxi, state: int) -> int:
    return taxi.decode(state)[2]


def render_grid(taxi, state: int, depot_letters: bool = True) -> str:
    """The 7-line ASCII map with T / P / D / O / X marking taxi, passenger and destination; the
    depots' letters R, G, Y, B left on their cells, or blanked (``depot_letters=False``, the paper's map)."""
    row, col, passenger, destination = taxi.decode(state)
    grid = [[c.decode() for c in line] for line in taxi.desc]
    if not depot_letters:
        for depot_row, depot_col in taxi.locs:
            grid[1 + depot_row][2 * depot_col + 1] = " "

    def mark(cell: tuple[int, int], char: str) -> None:
        grid[1 + cell[0]][2 * cell[1] + 1] = char

    mark(taxi.locs[destination], "D")
    if passenger == IN_TAXI:
        mark((row, col), "X")
    else:
        mark(taxi.locs[passenger], "P")
        mark((row, col), "O" if (row, col) == taxi.locs[passenger] else "T")
    return "".join("".join(line) + "\n" for line in grid)


def shortest_plan(taxi, state: int, goal: str) -> list[int]:
    """BFS over the deterministic MDP: the shortest safe action sequence reaching ``goal``.

    ``goal`` is ``"pickup"`` (the passenger gets into the taxi) or ``"deliver"`` (the
    passenger is dropped at the destination). Actions that leave the state unchanged
    are deadly and never used. Ties are broken by action order, so plans are deterministic.
    """
    if goal not in ("pickup", "deliver"):
        raise ValueError(f"goal must be 'pickup' or 'deliver', got {goal!r}")
    if goal == "pickup" and _passenger(taxi, state) == IN_TAXI:
        return []
    parents: dict[int, tuple[int, int] | None] = {state: None}
    queue = deque([state])
    while queue:
        current = queue.popleft()
        for action in range(len(ACTION_NAMES)):
            ((_, after, _, delivered),) = taxi.P[current][action]
            if after == current:
                continue  # deadly
            if delivered if goal == "deliver" else action == PICKUP and _passenger(taxi, after) == IN_TAXI:
                plan = [action]
                while parents[current] is not None:
                    current, previous_action = parents[current]
                    plan.append(previous_action)
                return plan[::-1]
            if after not in parents:
                parents[after] = (current, action)
                queue.append(after)
    return []


# --- the registry's view of Taxi ------------------------------------------------------------


def taxi_curriculum(max_steps: int, index: int | None = None) -> Curriculum:
    """``--taxi_curriculum``: pickup, drop-off, the full task, a third of the iterations each."""
    levels = [Level(name, [{"curriculum": name}]) for name in CURRICULA]
    curriculum = Curriculum(levels, proportional_steps([1, 1, 1], max_steps))
    return curriculum if index is None else curriculum.only(index)


def _settings(settings: EnvSettings, *, evaluation: bool, run_dir, split) -> dict:
    return {"with_prompt": settings.with_prompt, "with_history": settings.with_history,
            "first_step": settings.first_step, "oracle_completion": settings.oracle_completion,
            "pickup_reward": settings.pickup_reward, "danger_on_first_step": settings.danger_on_first_step,
            "depot_letters": settings.taxi_depot_letters}


def _curriculum(settings: EnvSettings, max_steps: int) -> Curriculum:
    if settings.taxi_curriculum:
        return taxi_curriculum(max_steps, settings.curriculum_index)
    return single_level(PLAIN, [{"curriculum": PLAIN}], max_steps)


def _held_out(settings: EnvSettings, env) -> list[tuple[dict, str]]:
    """With ``--taxi_curriculum``, every level (or the one ``--curriculum_index`` names); without, the task
    trained (``plain``) and the three levels beside it."""
    if settings.curriculum_index is not None:
        levels = (CURRICULA[settings.curriculum_index],)
    else:
        levels = CURRICULA if settings.taxi_curriculum else (PLAIN,) + CURRICULA
    return [({"curriculum": level}, level) for level in levels]


# The system message of an API model playing it (evaluation.gpt_agent).
API_INSTRUCTIONS = (
    "You drive a taxi in a 5x5 grid city shown as an ASCII map: '|' is a wall, ':' open road. "
    "The depots are R (top left), G (top right), Y (bottom left) and B (bottom). On the map T is the "
    "taxi, P the waiting passenger, D the destination, O the taxi standing on the passenger's cell, "
    "X the taxi carrying the passenger. Rows count from 0 at the top, columns from 0 at the left. "
    "South increases the row, east increases the column. Drive to the passenger, pick them up, drive "
    "to the destination and drop them off, in as few moves as possible. Driving into a wall, picking "
    "up where there is no passenger or dropping off where you may not ends the game with a penalty."
)


SPEC = EnvSpec(
    name="taxi", make=DangerousTaxiEnv, settings=_settings, curriculum=_curriculum, held_out=_held_out,
    play_options=lambda settings, rng: {"curriculum": curriculum_at(settings.curriculum_index)},
    data_steps=("data_gen.taxi.reflection", "data_gen.taxi.brute_force", "data_gen.taxi.gen_sft"),
    own_flags=("with_prompt", "with_history", "taxi_depot_letters", "danger_on_first_step", "pickup_reward",
               "sft_label", "random_prob"),
    exclusive_flags=("taxi_curriculum", "first_step", "oracle_completion"),
    api_instructions=API_INSTRUCTIONS,
)
