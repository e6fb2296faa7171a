"""Answer quality: each system's greedy answers to a fixed set of factual
questions, side by side (quantization may change what a small model says)."""

from __future__ import annotations

import asyncio
from typing import Any

from benchmarks.client import StreamSender

QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What is the capital of France? Answer in one sentence.", ("paris",)),
    ("What is the capital of Japan?", ("tokyo",)),
    ("What is the capital of Italy?", ("rome",)),
    ("What is the capital of Canada?", ("ottawa",)),
    ("What is 7 + 5?", ("12", "twelve")),
    ("What is 9 times 3?", ("27", "twenty-seven", "twenty seven")),
    ("How many days are there in a week?", ("7", "seven")),
    ("Who wrote Romeo and Juliet?", ("shakespeare",)),
)
"""(question, accepted answers: any of these, case-insensitive, counts as right)."""
MAX_TOKENS = 48


async def answers(sender: StreamSender, model: str) -> list[dict[str, Any]]:
    """The greedy answer (temperature 0, `MAX_TOKENS`) to each question, with
    whether it contains an accepted answer."""
    bodies = [{"model": model, "messages": [{"role": "user", "content": q}], "max_tokens": MAX_TOKENS,
               "temperature": 0} for q, _ in QUESTIONS]
    records = await asyncio.gather(*(sender.send(body, keep_text=True) for body in bodies))
    return [{"question": q, "answer": r.text if r.ok else None, "status": r.status,
             "correct": r.ok and any(a in r.text.lower() for a in accepted)}
            for (q, accepted), r in zip(QUESTIONS, records, strict=True)]


def side_by_side(by_system: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One row per question with every system's answer, and each system's score."""
    rows = []
    for i, (question, accepted) in enumerate(QUESTIONS):
        row: dict[str, Any] = {"question": question, "accepted": list(accepted)}
        for system, found in by_system.items():
            row[system] = found[i]["answer"]
        rows.append(row)
    scores = {system: f"{sum(a['correct'] for a in found)}/{len(found)}" for system, found in by_system.items()}
    return {"temperature": 0, "max_tokens": MAX_TOKENS, "rows": rows, "correct": scores}
