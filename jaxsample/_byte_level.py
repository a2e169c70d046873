"""GPT-2's byte-level BPE alphabet, shared by the tokenizer-vocabulary readers (infill, structured)."""

from __future__ import annotations

import functools


@functools.cache
def unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: printable bytes map to themselves, the others to 256+.

    >>> table = unicode_to_byte()
    >>> table["A"], table["\\u0120"]  # 'Ġ' is the space byte
    (65, 32)
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table
