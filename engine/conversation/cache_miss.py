"""Why a served turn prefilled what its conversation's cells had held: the first prompt position it did not
reuse, the text on both sides of it, and the cause in words.

llama-server logs ten tokens around a divergence and nothing else; an agent's user needs to know which of
their agent's habits cost the cache (a value in the system header that changes every turn, a reminder that
moves, a history trimmed from the front) and whether the server did it (a conversation displaced by
another, a history dropped while it waited)."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

EXCERPT_TOKENS = 8  # the text shown on each side of a divergence: this many tokens from it
MATCH_TOKENS = 16  # a run this long found again after the divergence tells a removal or an insertion apart


@dataclass(frozen=True)
class CacheMiss:
    at: int  # the first prompt position not reused from the conversation's own cells
    cause: str  # new | displaced | dropped | system | trimmed | inserted | edited | reply
    words: str  # the cause, said to a user
    old: str = ""  # what the conversation held from `at` (a few tokens' text)
    new: str = ""  # what the prompt has there


def _find(hay: Sequence[int], needle: Sequence[int], start: int) -> int:
    """The first index >= start where needle occurs in hay; -1 if none (its first token looked for by
    list.index, in C: a placement on the engine's thread asks this of 8k-token conversations)."""
    if not needle:
        return -1
    hay, needle = list(hay), list(needle)
    first, n = needle[0], len(needle)
    i = start
    while i <= len(hay) - n:
        try:
            i = hay.index(first, i, len(hay) - n + 1)
        except ValueError:
            return -1
        if hay[i : i + n] == needle:
            return i
        i += 1
    return -1


def diverged(held: Sequence[int], prompt: Sequence[int], keep: int, system_tokens: int,
             text: Callable[[Sequence[int]], str]) -> CacheMiss:
    """The prompt shares `keep` tokens with the history its conversation held and goes on otherwise.
    system_tokens: where the system prompt's text ends in the prompt, 0 if unknown."""
    old = text(held[keep : keep + EXCERPT_TOKENS])
    new = text(prompt[keep : keep + EXCERPT_TOKENS])
    if keep < system_tokens:
        return CacheMiss(keep, "system", f"the system prompt changed at token {keep:,}: everything after it was "
                         "prefilled again", old, new)
    w = min(MATCH_TOKENS, len(prompt) - keep, len(held) - keep)
    if w > 0:
        moved_to = _find(held, prompt[keep : keep + w], keep + 1)
        if moved_to > 0:
            return CacheMiss(keep, "trimmed", f"{moved_to - keep:,} tokens were removed at token {keep:,} (the "
                             "conversation was trimmed): what followed them was prefilled again", old, new)
        moved_from = _find(prompt, held[keep : keep + w], keep + 1)
        if moved_from > 0:
            return CacheMiss(keep, "inserted", f"{moved_from - keep:,} tokens were inserted at token {keep:,}: "
                             "what followed them was prefilled again", old, new)
    return CacheMiss(keep, "edited", f"an earlier message was edited at token {keep:,}: everything after it was "
                     "prefilled again", old, new)


def new_conversation(copied: int, donor_label: str) -> CacheMiss:
    if copied:
        return CacheMiss(copied, "new", f"a new conversation: {copied:,} tokens copied from {donor_label}, the "
                         "rest prefilled")
    return CacheMiss(0, "new", "a new conversation: no agent held its beginning")


def displaced(at: int, by: str) -> CacheMiss:
    return CacheMiss(at, "displaced", f"its conversation was displaced by {by} while it waited for its client: "
                     "prefilled again" + (f" after the {at:,} tokens copied back" if at else ""))


def dropped(at: int) -> CacheMiss:
    return CacheMiss(at, "dropped", "its history's cells were gone when it came back (dropped while it waited, "
                     "--residency drop, or preempted for room): prefilled again")


def kept_by_shift(m: CacheMiss, shifted: int, prefilled: int) -> CacheMiss:
    """A divergence past which runs of the old cells were kept (engine/conversation/chunk_reuse.py): the cause
    stays, the consequence (every cause's words end in ": " and what was prefilled) is said again."""
    cause = m.words.split(": ", 1)[0]
    return replace(m, words=f"{cause}: {shifted:,} tokens after it were kept, shifted into place; "
                            f"{prefilled:,} prefilled")


def short(m: CacheMiss, shifted: int, prefilled: int) -> str:
    """A miss in a few words, for a dashboard's row: "system at 8: 2,683 kept by shift, 150 prefilled"."""
    kept = f"{shifted:,} kept by shift, " if shifted else ""
    return f"{m.cause} at {m.at:,}: {kept}{prefilled:,} prefilled"
