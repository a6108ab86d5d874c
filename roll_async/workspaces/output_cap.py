"""How a command's output that ran past a runtime's cap reads: its head and tail around one marker.

Both runtimes keep the first and the last part of a long output (an error message is at the end, the
command's start at the top) and say how much of the middle they dropped, in the same words, so an agent
(and a test) reads one format whichever runtime ran the command.
"""

from __future__ import annotations

#: What a command's output shows in place of the middle it lost to the cap.
CUT_MARKER = "\n... [{} bytes of output cut] ...\n"


def cut_middle(head: bytes, tail: bytes, total: int) -> tuple[str, bool]:
    """The kept ``head`` and ``tail`` of an output of ``total`` bytes as text, and whether a middle was cut.

    Nothing was cut when head and tail together hold every byte; then they are joined as they are.
    """
    cut = total - len(head) - len(tail)
    if cut <= 0:
        return (head + tail).decode("utf-8", "replace"), False
    text = (
        head.decode("utf-8", "replace")
        + CUT_MARKER.format(cut)
        + tail.decode("utf-8", "replace")
    )
    return text, True
