"""The one prompt builder: splits, markers, SFT texts and completions."""

import pytest

from prompts import (
    ACTION_MARKER,
    ANALYZE_MARKER,
    LABELS,
    MENU_LINE,
    clean_reflection,
    completion_start,
    menu_line,
    policy_prompt,
    policy_sft_text,
    reflection_prompt,
    reflection_sft_text,
    shown_menu,
    split_observation,
)

HEAD = "The actions you can take now is:"
OBS = f"--- Current State ---\ngrid\n{HEAD}\n0. move south\n1. move north\n"


def test_label_set():
    assert LABELS[:3] == ("0", "1", "2") and LABELS[199] == "199"
    assert LABELS[200] == "a" and LABELS[226] == "A" and LABELS[-1] == "Z"
    assert len(LABELS) == len(set(LABELS)) == 252


def test_split_at_the_action_head():
    before, after = split_observation(OBS, HEAD)
    assert before == "--- Current State ---\ngrid\n" and after.startswith(HEAD) and before + after == OBS
    with pytest.raises(ValueError, match="action head"):
        split_observation("no list here", HEAD)


def test_the_menu_is_read_back_from_where_it_ends():
    """One format for a menu line, written by the environments and read back by the command answers, the
    relabelling and the reflector's accuracy: only the menu the text ends with, not list-like lines above it."""
    listed = "".join(menu_line(label, command) for label, command in [("0", "cat a. b.py"), ("1", "cd ..")])
    obs = f"--- Current State ---\n1. a numbered line of the state\n{HEAD}\n{listed}"
    expected = [("0", "cat a. b.py"), ("1", "cd ..")]
    assert shown_menu(obs, LABELS) == expected
    assert shown_menu(policy_prompt(obs, HEAD, "Read b."), LABELS) == expected
    assert shown_menu(policy_prompt(obs, HEAD, "Read b.", "Think. ", "paper") + "cd ..\n", LABELS) == expected
    assert shown_menu(obs, ("1",)) == [("1", "cd ..")]  # a label outside the alphabet ends the menu
    assert shown_menu("no menu\n", LABELS) == []
    assert MENU_LINE.fullmatch("a b. c") is None and MENU_LINE.fullmatch("ab. c").groups() == ("ab", "c")


def test_prompt_shapes():
    assert policy_prompt(OBS, HEAD) == OBS + ACTION_MARKER
    before, after = split_observation(OBS, HEAD)
    assert reflection_prompt(OBS, HEAD, "Think. ") == "Think. " + before + ANALYZE_MARKER
    assert policy_prompt(OBS, HEAD, "Go south.") == before + ANALYZE_MARKER + "Go south.\n" + after + ACTION_MARKER


def test_the_papers_layout():
    """The paper's code: the marker ends the state's last line, and the policy's prompt with a reflection
    keeps the instruction at the top; without a reflection the prompt is the same in both layouts."""
    assert reflection_prompt(OBS, HEAD, "Think. ", "paper") == "Think. --- Current State ---\ngrid" + ANALYZE_MARKER
    assert policy_prompt(OBS, HEAD, "Go south.", instruction="Think. ", layout="paper") == (
        "Think. --- Current State ---\ngrid" + ANALYZE_MARKER + "Go south.\n" + HEAD + "\n0. move south\n"
        "1. move north\n" + ACTION_MARKER)
    assert policy_prompt(OBS, HEAD, instruction="Think. ", layout="paper") == policy_prompt(OBS, HEAD)
    assert policy_prompt(OBS, HEAD, "Go.", instruction="Think. ") == policy_prompt(OBS, HEAD, "Go.")  # ours: none
    text = policy_sft_text(OBS, HEAD, "1", reflection="Go.", instruction="Think. ", layout="paper")
    assert completion_start(text) == len(text) - 1
    with pytest.raises(ValueError, match="text layout"):
        reflection_prompt(OBS, HEAD, layout="theirs")


def test_the_paper_instructs_only_taxis_reflector():
    from envs.alfworld import ALFWorldEnv
    from envs.auto_explore import AutoExploreEnv
    from envs.taxi import DangerousTaxiEnv

    assert DangerousTaxiEnv.instruction("paper") == DangerousTaxiEnv.instruction("ours") != ""
    assert ALFWorldEnv.instruction("paper") == "" and ALFWorldEnv.instruction("ours") != ""
    assert AutoExploreEnv.instruction("paper") == AutoExploreEnv.instruction("ours") == ""


def test_the_rollout_and_the_sft_texts_use_the_environments_layout(make_args, tiny_path):
    """A policy trained on SFT texts of one layout reads prompts of the same layout in RL."""
    import numpy as np

    from data_gen.sft import sft_texts
    from envs import make_env
    from envs.taxi import DangerousTaxiEnv
    from rollout import EpisodeStart, TwoPlayerRollout
    from utils import models

    args = make_args(env="taxi")
    policy, tokenizer = models.load_model_and_tokenizer(models.ModelSettings.from_args(args), trainable=False)
    rollout = TwoPlayerRollout(policy, tokenizer, reflector=policy, reflect_tokenizer=tokenizer, greedy=True)
    env = make_env("taxi", text_layout="paper", depot_letters=False, labels=rollout.labels, horizon=1)
    (episode,) = rollout.run([env], [EpisodeStart(seed=3, options={"curriculum": "pickup"})],
                             np.random.default_rng(0))
    decision = episode.decisions[0]
    obs, _ = make_env("taxi", text_layout="paper", depot_letters=False, labels=rollout.labels).reset(
        seed=3, options={"curriculum": "pickup"})
    _, _, policy_text = sft_texts(obs, DangerousTaxiEnv, "0", decision.reflection, "paper")
    assert policy_text == decision.prompt + "0"
    assert policy_text.startswith(DangerousTaxiEnv.analyze_instruction)


def test_sft_texts_are_prompt_plus_completion():
    text = policy_sft_text(OBS, HEAD, "1", reflection="Go north.")
    prompt = policy_prompt(OBS, HEAD, "Go north.")
    assert text == prompt + "1" and completion_start(text) == len(prompt)
    text = reflection_sft_text(OBS, HEAD, "Go north.", instruction="Think. ")
    prompt = reflection_prompt(OBS, HEAD, "Think. ")
    assert text == prompt + "Go north.\n" and completion_start(text) == len(prompt)
    text = policy_sft_text(OBS, HEAD, "0")
    assert completion_start(text) == len(OBS + ACTION_MARKER)
    with pytest.raises(ValueError, match="neither"):
        completion_start("plain text")


def test_reflection_is_cut_and_one_line():
    assert clean_reflection("  Go\nnorth. # Action:\n3 more") == "Go north.\n"
    assert clean_reflection("a # Analyze: b") == "a\n"
    assert clean_reflection("") == "\n"
