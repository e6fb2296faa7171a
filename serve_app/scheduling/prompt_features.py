"""What the length predictor reads from a request: its class, an instruction
fingerprint and hashed features.

The fingerprint is the system prompt plus the last user message's leading
`FINGERPRINT_WORDS` words, lowercased, with digit runs and whitespace
normalised, hashed: requests repeating an instruction share it whatever their
numbers or spacing. The features are CRC-32 hashes of the last user message's
leading and trailing words and word bigrams, its first words by position, the
system prompt's words, the message structure (turns, roles), size bins, the
sampling fields (`max_tokens`, stop strings, temperature, top_p, ignore_eos)
and the model. Words are taken from the first `HEAD_CHARS` and last
`TAIL_CHARS` characters of a message only, so the cost stays nearly flat
however long the prompt.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

FINGERPRINT_WORDS = 16
"""Leading words of the last user message in the instruction fingerprint."""
HEAD_WORDS = 48
"""Leading words of the last user message hashed as features."""
TAIL_WORDS = 16
"""Trailing words of a longer last user message hashed as features."""
POSITION_WORDS = 3
"""Leading words also hashed with their position ("what is", "write a")."""
SYSTEM_WORDS = 32
"""Leading words of the system prompt hashed as features."""
HEAD_CHARS = 1500
TAIL_CHARS = 300
"""Characters of a message read at its start and end."""

_WORD = re.compile(r"[a-z]+|\d+|[^\sa-z\d]")
_DIGITS = re.compile(r"\d+")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class SamplingSummary:
    """The sampling fields the predictor reads."""

    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    temperature: float = 1.0
    top_p: float = 1.0
    ignore_eos: bool = False


@dataclass(frozen=True)
class PromptClass:
    """What the predictor knows of a request's prompt."""

    kind: str
    """`chat` or `completion`."""
    template: str | None
    prompt_chars: int
    fingerprint: str | None = None
    """Hash of the normalised instruction (see the module docstring); None: unknown."""
    features: tuple[int, ...] = ()
    """CRC-32 hashes of the request's features, for the online model."""

    def key(self) -> str:
        """The coarse class: the template, else the endpoint and a log2 prompt-size bin."""
        if self.template is not None:
            return f"template:{self.template}"
        size_bin = 0 if self.prompt_chars <= 0 else int(math.log2(self.prompt_chars))
        return f"{self.kind}:2^{size_bin}"

    def history_key(self) -> str:
        """What output-length history is kept on: the template, else the fingerprint, else `key()`."""
        if self.template is None and self.fingerprint is not None:
            return f"fp:{self.fingerprint}"
        return self.key()


def _words(text: str) -> list[str]:
    return _WORD.findall(text[:HEAD_CHARS].lower())


def _tail_words(text: str) -> list[str]:
    return _WORD.findall(text[-TAIL_CHARS:].lower())[-TAIL_WORDS:]


def normalise(text: str) -> str:
    """Lowercased, digit runs as `0`, whitespace runs as one space, stripped."""
    return _SPACE.sub(" ", _DIGITS.sub("0", text[:HEAD_CHARS].lower())).strip()


def fingerprint(system: str, user: str) -> str:
    """The instruction fingerprint of a system prompt and the last user message."""
    leading = " ".join(normalise(user).split(" ")[:FINGERPRINT_WORDS])
    text = normalise(system) + "\x00" + leading
    return f"{zlib.crc32(text.encode()):08x}"


def _bin(value: float) -> int:
    return int(math.log2(1 + max(0.0, value)))


def describe(
    messages: Sequence[tuple[str, str]] | None,
    prompt: str | None,
    sampling: SamplingSummary,
    model: str | None = None,
    template: str | None = None,
) -> PromptClass:
    """The prompt class of a chat (`messages`, (role, content) pairs) or completion (`prompt`) request."""
    if messages is not None:
        kind, turns = "chat", list(messages)
    else:
        kind, turns = "completion", [("user", prompt or "")]
    system = " ".join(content for role, content in turns if role in ("system", "developer"))
    user = next((content for role, content in reversed(turns) if role == "user"), "")
    words = _words(user)
    lead = words[:HEAD_WORDS]
    if len(user) > HEAD_CHARS or len(words) > HEAD_WORDS:
        lead = lead + _tail_words(user)
    names = [f"kind:{kind}", f"turns:{min(len(turns), 8)}", f"chars:{_bin(len(user))}",
             f"history:{_bin(sum(len(c) for _, c in turns) - len(user))}",
             f"roles:{'/'.join(role for role, _ in turns[-4:])}", f"model:{model}",
             f"max_tokens:{_bin(sampling.max_tokens or 0)}", f"stops:{min(len(sampling.stop), 4)}",
             f"temperature:{round(sampling.temperature, 1)}", f"top_p:{round(sampling.top_p, 1)}",
             f"ignore_eos:{sampling.ignore_eos}", f"template:{template}"]
    names += [f"at{i}:{w}" for i, w in enumerate(words[:POSITION_WORDS])]
    names += lead
    names += [f"{a} {b}" for a, b in pairwise(lead)]
    names += [f"sys:{w}" for w in _words(system)[:SYSTEM_WORDS]]
    names += [f"stop:{s}" for s in sampling.stop[:4]]
    features = tuple(sorted({zlib.crc32(name.encode()) for name in names}))
    chars = sum(len(content) for _, content in turns) if messages is not None else len(prompt or "")
    return PromptClass(kind, template, chars, fingerprint(system, user), features)
