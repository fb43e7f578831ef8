"""The prompt format: markers, choice labels and the one builder of every prompt string.

SFT data, RL rollouts and evaluation all build their texts here, so a model never
sees a prompt at test time that differs from what it was trained on.

An observation ends with an enumerated action list that starts at the environment's
*action head* line. Split there, ``before`` is the state and ``after`` the list:

* policy prompt, no reflection:  ``obs + ACTION_MARKER``
* reflection prompt:             ``instruction + before + ANALYZE_MARKER``
* policy prompt with reflection: ``before + ANALYZE_MARKER + reflection + after + ACTION_MARKER``

An SFT text is the prompt followed by its completion (the reflection, or the label).
"""

import string

ANALYZE_MARKER = " # Analyze:\n"
ACTION_MARKER = " # Action:\n"

# The choice labels, in display order: "0".."199", then a..z, then A..Z.
LABELS: tuple[str, ...] = (
    tuple(str(i) for i in range(200)) + tuple(string.ascii_lowercase) + tuple(string.ascii_uppercase)
)


def split_observation(obs: str, action_head: str) -> tuple[str, str]:
    """Split ``obs`` at the action head line into (state, action list)."""
    index = obs.rfind(action_head)
    if index < 0:
        raise ValueError(f"observation has no action head {action_head!r}: {obs[-200:]!r}")
    return obs[:index], obs[index:]


def reflection_prompt(obs: str, action_head: str, instruction: str = "") -> str:
    """What the reflection model reads; the reflection is generated after it."""
    before, _ = split_observation(obs, action_head)
    return instruction + before + ANALYZE_MARKER


def policy_prompt(obs: str, action_head: str, reflection: str | None = None) -> str:
    """What the policy reads; its next token is the choice label."""
    if reflection is None:
        return obs + ACTION_MARKER
    before, after = split_observation(obs, action_head)
    return before + ANALYZE_MARKER + clean_reflection(reflection) + after + ACTION_MARKER


def clean_reflection(text: str) -> str:
    """A reflection as it appears in prompts: cut at any marker, one line, newline-terminated.

    Keeping reflections on one line lets generation stop at the first newline.
    """
    for marker in (ACTION_MARKER.strip(), ANALYZE_MARKER.strip()):
        index = text.find(marker)
        if index >= 0:
            text = text[:index]
    return " ".join(text.split()) + "\n"


def reflection_sft_text(obs: str, action_head: str, reflection: str, instruction: str = "") -> str:
    return reflection_prompt(obs, action_head, instruction) + clean_reflection(reflection)


def policy_sft_text(obs: str, action_head: str, label: str, reflection: str | None = None) -> str:
    return policy_prompt(obs, action_head, reflection) + label


def completion_start(text: str) -> int:
    """Index where an SFT text's completion starts: after its last marker.

    Policy texts end with ``ACTION_MARKER + label`` and reflection texts with
    ``ANALYZE_MARKER + reflection``; a reflection never holds a marker (see
    :func:`clean_reflection`), so the last marker is the right one for both.
    """
    index = max(text.rfind(ACTION_MARKER), text.rfind(ANALYZE_MARKER))
    if index < 0:
        raise ValueError(f"SFT text has neither {ACTION_MARKER!r} nor {ANALYZE_MARKER!r}: {text[:200]!r}")
    marker = ACTION_MARKER if text.startswith(ACTION_MARKER, index) else ANALYZE_MARKER
    return index + len(marker)


def label_token_ids(tokenizer, labels=LABELS) -> list[int]:
    """The token id of each label; every label must be ONE token, also right after a marker.

    Raises ``ValueError`` listing the offending labels, or naming a marker that merges
    with the text after it (then prompt + completion would not tokenize as prompt,
    then completion).
    """
    marker_ids = tokenizer.encode(ACTION_MARKER, add_special_tokens=False)
    ids, bad = [], []
    for label in labels:
        alone = tokenizer.encode(label, add_special_tokens=False)
        after_marker = tokenizer.encode(ACTION_MARKER + label, add_special_tokens=False)
        if len(alone) != 1 or after_marker != marker_ids + alone:
            bad.append(label)
        else:
            ids.append(alone[0])
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if bad:
        raise ValueError(f"{len(bad)} choice labels are not one token after {ACTION_MARKER!r} "
                         f"with tokenizer {name!r}: {bad}")
    for marker in (ANALYZE_MARKER, ACTION_MARKER):
        prefix = tokenizer.encode("state" + marker, add_special_tokens=False)
        whole = tokenizer.encode("state" + marker + "Reflection.", add_special_tokens=False)
        if whole[: len(prefix)] != prefix:
            raise ValueError(f"tokenizer {name!r} merges the marker {marker!r} with the text after it")
    return ids
