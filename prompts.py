"""The prompt format: markers, choice labels and the one builder of every prompt string.

SFT data, RL rollouts and evaluation all build their texts here, so a model never
sees a prompt at test time that differs from what it was trained on.

An observation ends with an enumerated action list that starts at the environment's
*action head* line. Split there, ``before`` is the state and ``after`` the list:

* policy prompt, no reflection:  ``obs + ACTION_MARKER``
* reflection prompt:             ``instruction + before + ANALYZE_MARKER``
* policy prompt with reflection: ``before + ANALYZE_MARKER + reflection + after + ACTION_MARKER``

That is the ``ours`` text layout. The ``paper`` layout (``--text_layout paper``) arranges them
as the paper's code does: the analyze marker on the state's last line (``before`` without
its final newline), and the instruction kept at the top of the policy prompt with reflection.

An SFT text is the prompt followed by its completion (the reflection, or the label).

The choice labels are the paper's (:data:`LABELS`) wherever the model's tokenizer keeps
each of them one token after the action marker (the GPT-2 family). Other tokenizers
(SmolLM2, Qwen2.5, Gemma, Llama-3 split ``"12"`` into digits) get their own *alphabet*,
chosen by :func:`label_alphabet`; observations rendered with the paper's labels are
carried over to an alphabet by :func:`relabel`, and a label file saved with SFT data and
checkpoints (:func:`write_label_file`, :func:`check_label_file`) keeps data, training
and evaluation on one alphabet.
"""

import itertools
import json
import re
import string
import weakref
from pathlib import Path

from utils.errors import UsageError

ANALYZE_MARKER = " # Analyze:\n"
ACTION_MARKER = " # Action:\n"
TEXT_LAYOUTS = ("ours", "paper")  # --text_layout: how prompts (and the environments' texts) are arranged

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


def _analyzed(obs: str, action_head: str, instruction: str, layout: str) -> tuple[str, str]:
    """(the prompt up to and including the analyze marker, the action list) in ``layout``."""
    if layout not in TEXT_LAYOUTS:
        raise ValueError(f"text layout must be one of {TEXT_LAYOUTS}, got {layout!r}")
    before, after = split_observation(obs, action_head)
    if layout == "paper" and before.endswith("\n"):
        before = before[:-1]  # the marker ends the state's last line
    return instruction + before + ANALYZE_MARKER, after


def reflection_prompt(obs: str, action_head: str, instruction: str = "", layout: str = "ours") -> str:
    """What the reflection model reads; the reflection is generated after it."""
    return _analyzed(obs, action_head, instruction, layout)[0]


def policy_prompt(obs: str, action_head: str, reflection: str | None = None, one_line: bool = True,
                  instruction: str = "", layout: str = "ours") -> str:
    """What the policy reads; its next token is the choice label. ``instruction`` (the environment's
    analyze instruction) stays at the top with a reflection in the ``paper`` layout only."""
    if reflection is None:
        return obs + ACTION_MARKER
    head, after = _analyzed(obs, action_head, instruction if layout == "paper" else "", layout)
    return head + clean_reflection(reflection, one_line) + after + ACTION_MARKER


def clean_reflection(text: str, one_line: bool = True) -> str:
    """A reflection as it appears in prompts: cut at any marker, newline-terminated, and on one line
    (``one_line``: generation then stops at the first newline) or with its lines kept whole (the
    paper's code; ``--no_reflect_one_line``), their trailing spaces and blank lines dropped.
    """
    for marker in (ACTION_MARKER.strip(), ANALYZE_MARKER.strip()):
        index = text.find(marker)
        if index >= 0:
            text = text[:index]
    if one_line:
        return " ".join(text.split()) + "\n"
    return "".join(line.rstrip() + "\n" for line in text.strip().splitlines() if line.strip()) or "\n"


def reflection_sft_text(obs: str, action_head: str, reflection: str, instruction: str = "",
                        layout: str = "ours") -> str:
    return reflection_prompt(obs, action_head, instruction, layout) + clean_reflection(reflection)


def policy_sft_text(obs: str, action_head: str, label: str, reflection: str | None = None, instruction: str = "",
                    layout: str = "ours") -> str:
    return policy_prompt(obs, action_head, reflection, instruction=instruction, layout=layout) + label


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


# --- choice labels that fit a tokenizer ------------------------------------------------------

# How a policy prompt ends (the last listed action, then the marker): a label is read
# as the next token right here.
_LABEL_CONTEXT = "0. go north\n" + ACTION_MARKER


def _extra_candidates():
    """Labels tried, in this order, after the paper's: two letters (aa..zz, Aa..Zz, AA..ZZ)."""
    lower, upper = string.ascii_lowercase, string.ascii_uppercase
    for first, second in ((lower, lower), (upper, lower), (upper, upper)):
        for a, b in itertools.product(first, second):
            yield a + b


def tokenizer_name(tokenizer) -> str:
    return getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__


def _single_token_ids(tokenizer, labels) -> list[int | None]:
    """Each label's token id where a prompt + label text tokenises as the prompt, then ONE
    token (the label's), else None. (SentencePiece tokenizers may spell a label differently
    alone; only its spelling after the marker matters.)"""
    context = tokenizer.encode(_LABEL_CONTEXT, add_special_tokens=False)
    # one batch call: a fast tokenizer encodes the candidates together, as it would one by one
    encoded = tokenizer([_LABEL_CONTEXT + label for label in labels], add_special_tokens=False)["input_ids"]
    return [after[-1] if len(after) == len(context) + 1 and after[: len(context)] == context else None
            for after in encoded]


def _check_markers(tokenizer) -> None:
    """A marker must end at a token boundary whatever follows it."""
    for marker in (ANALYZE_MARKER, ACTION_MARKER):
        prefix = tokenizer.encode("state" + marker, add_special_tokens=False)
        whole = tokenizer.encode("state" + marker + "Reflection.", add_special_tokens=False)
        if whole[: len(prefix)] != prefix:
            raise UsageError(f"tokenizer {tokenizer_name(tokenizer)!r} merges the marker {marker!r} with the "
                             "text after it")


_ALPHABETS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def label_alphabet(tokenizer) -> tuple[str, ...]:
    """The choice labels of ``tokenizer``, as many as :data:`LABELS`, in display order.

    The paper's labels if each is one token after the action marker (the GPT-2 family).
    Otherwise the paper's labels that are one
    token, in their order, then two-letter labels (see :func:`_extra_candidates`) that are,
    with distinct token ids; deterministic for a tokenizer. Raises a one-line
    ``ValueError`` naming the model if the tokenizer cannot supply enough.
    """
    cached = _ALPHABETS.get(tokenizer)
    if cached is not None:
        return cached
    _check_markers(tokenizer)
    chosen, seen = [], set()
    for batch in (LABELS, tuple(_extra_candidates())):
        if len(chosen) == len(LABELS):
            break  # the paper's labels sufficed (the GPT-2 family)
        for label, token in zip(batch, _single_token_ids(tokenizer, batch)):
            if token is not None and token not in seen and len(chosen) < len(LABELS):
                chosen.append(label)
                seen.add(token)
    if len(chosen) < len(LABELS):
        raise UsageError(f"tokenizer {tokenizer_name(tokenizer)!r} supplies only {len(chosen)} choice labels that "
                         f"are one token after {ACTION_MARKER!r}; {len(LABELS)} are needed (the paper's labels "
                         "0..199, a..z, A..Z and two-letter ones were tried)")
    alphabet = tuple(chosen)
    _ALPHABETS[tokenizer] = alphabet
    return alphabet


def label_token_ids(tokenizer, labels=None) -> list[int]:
    """The token id of each label (default: the tokenizer's :func:`label_alphabet`).

    Raises ``ValueError`` listing the labels that are not one token after the marker.
    """
    labels = label_alphabet(tokenizer) if labels is None else tuple(labels)
    ids = _single_token_ids(tokenizer, labels)
    bad = [label for label, token in zip(labels, ids) if token is None]
    if bad:
        raise UsageError(f"{len(bad)} choice labels are not one token after {ACTION_MARKER!r} "
                         f"with tokenizer {tokenizer_name(tokenizer)!r}: {bad}")
    _check_markers(tokenizer)
    return ids


# --- the menu an observation ends with: one ``<label>. <command>`` line per action ---------------

MENU_LINE = re.compile(r"^([^.\s]+)\. (.*)$", re.M)  # a label (no dot, no space), a dot and a space, the command


def menu_line(label: str, command: str) -> str:
    """One line of a menu (envs/base.py renders every observation's actions with it)."""
    return f"{label}. {command}\n"


def shown_menu(text: str, alphabet) -> list[tuple[str, str]]:
    """The (label, command) lines of the menu ``text`` ends with: its last run of :func:`menu_line` lines with
    labels of ``alphabet``. ``text`` is an observation, or a policy prompt (the menu ends at its action marker)."""
    if ACTION_MARKER in text:
        text = text[:text.rindex(ACTION_MARKER)]  # in the paper's layout the marker ends the menu's last line
    found = []
    for line in reversed(text.splitlines()):
        entry = MENU_LINE.fullmatch(line)
        if entry is None or entry.group(1) not in alphabet:
            break
        found.append((entry.group(1), entry.group(2)))
    return found[::-1]


def relabel(obs: str, action_head: str, labels) -> str:
    """``obs`` (rendered with the paper's :data:`LABELS`) with each listed action's label
    replaced by the one at the same position of ``labels``."""
    labels = tuple(labels)
    if labels == LABELS:
        return obs
    before, after = split_observation(obs, action_head)
    mapping = dict(zip(LABELS, labels))

    def swap(entry: re.Match) -> str:
        if entry.group(1) not in mapping:
            raise ValueError(f"action line {entry.group(0)!r} has no label of the paper's alphabet")
        return menu_line(mapping[entry.group(1)], entry.group(2)).rstrip("\n")

    head, _, listing = after.partition("\n")
    return before + head + "\n" + MENU_LINE.sub(swap, listing)


def relabel_label(label: str, labels) -> str:
    """The label at ``label``'s position of :data:`LABELS` in ``labels``."""
    return tuple(labels)[LABELS.index(label)]


# --- the label file of SFT data and checkpoints ----------------------------------------------

LABEL_FILE = "labels.json"


def write_label_file(directory, labels, model: str) -> Path:
    """Save the alphabet (and the model it was chosen for) as ``<directory>/labels.json``."""
    path = Path(directory) / LABEL_FILE
    path.write_text(json.dumps({"model": model, "labels": list(labels)}, indent=1) + "\n", encoding="utf-8")
    return path


def read_label_file(directory) -> dict | None:
    """``{"model", "labels"}`` from ``<directory>/labels.json``; None if there is none (the paper's labels)."""
    path = Path(directory) / LABEL_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {"model": str(data["model"]), "labels": tuple(data["labels"])}
    except (ValueError, KeyError, TypeError) as error:
        raise UsageError(f"{path} is not a label file ({error})") from None


def check_label_file(directory, labels, model: str, what: str) -> None:
    """Stop with one line naming both sides if ``what`` (``directory``) was made with other
    choice labels than ``labels``, the alphabet of ``model``. No file means the paper's labels."""
    saved = read_label_file(directory)
    theirs = LABELS if saved is None else saved["labels"]
    if tuple(theirs) == tuple(labels):
        return
    source = f"model {saved['model']!r}" if saved else "the paper's labels (it has no labels.json)"
    differ = next(i for i, (a, b) in enumerate(itertools.zip_longest(theirs, labels)) if a != b)
    raise UsageError(f"{what} {str(directory)!r} uses the choice labels of {source}, but model {model!r} uses "
                     f"other ones (label {differ}: {_at(theirs, differ)!r} there, {_at(labels, differ)!r} here); "
                     f"make it again for {model!r}")


def _at(labels, index: int):
    return labels[index] if index < len(labels) else None
