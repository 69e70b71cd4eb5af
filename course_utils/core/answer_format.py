"""The answer format: what the system prompt asks for, what the warm start teaches, what the rewards check.

One home for the XML layout, so the prompt, the training targets and the checks cannot drift apart::

    <reasoning>
    ...
    </reasoning>
    <answer>
    ...
    </answer>

No imports beyond the standard library: every other module may depend on this one.
"""

from __future__ import annotations

REASONING_OPEN, REASONING_CLOSE = "<reasoning>", "</reasoning>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (REASONING_OPEN, REASONING_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

XML_TEMPLATE = f"{REASONING_OPEN}\n{{reasoning}}\n{REASONING_CLOSE}\n{ANSWER_OPEN}\n{{answer}}\n{ANSWER_CLOSE}"
SYSTEM_PROMPT = "Respond in the following format:\n" + XML_TEMPLATE.format(reasoning="...", answer="...")


def format_answer(reasoning: str, answer: str) -> str:
    """A completion in the exact layout the system prompt asks for (the strict format)."""
    return XML_TEMPLATE.format(reasoning=reasoning, answer=answer)


def extract_xml_answer(text: str | None) -> str:
    """The content of the last complete ``<answer>...</answer>`` block, stripped; ``""`` when none.

    ``str.rfind`` instead of a regex: linear time on any input, so a 1 MB completion full of tags
    cannot stall a reward. A non-string (``None`` from a failed generation, say) holds no answer.
    """
    if not isinstance(text, str):
        return ""
    end = text.rfind(ANSWER_CLOSE)
    if end == -1:
        return ""
    start = text.rfind(ANSWER_OPEN, 0, end)
    if start == -1:
        return ""
    return text[start + len(ANSWER_OPEN) : end].strip()


__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "REASONING_CLOSE",
    "REASONING_OPEN",
    "SYSTEM_PROMPT",
    "TAGS",
    "XML_TEMPLATE",
    "extract_xml_answer",
    "format_answer",
]
