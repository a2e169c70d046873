"""A host-side matcher over a compiled grammar's tables, with the API of the host engines.

:class:`Matcher` steps one output through the *same* tables the device uses (``TokenGrammar``:
classes, ``next``, bitmasks, and for recursive grammars the effects, stack-dependent token lists
and per-room masks), so tests and tools can drive a grammar without a device, and device
stepping can be checked against it token by token. The API follows XGrammar's ``GrammarMatcher``
and llguidance's ``LLMatcher``:

* :meth:`Matcher.accept_token` -> ``bool`` (the state is unchanged when the token is refused),
* :meth:`Matcher.fill_next_token_bitmask` into an ``int32[batch, ceil(V/32)]`` bitmask (bit ``j``
  of word ``i`` is token ``32*i+j``),
* :meth:`Matcher.is_terminated` (an EOS id was accepted; afterwards only EOS is allowed, and
  accepting it again changes nothing — as a finished device row),
* :meth:`Matcher.rollback` of the last ``n`` accepted tokens, :meth:`Matcher.reset`.

Semantics (shared with :mod:`~jaxsample.structured.tables`): a token's class gives ``next[state,
class]``; a value below ``num_states`` is the new state; above, an *effect*: a stay that pushes
return states, or a return that pops the top state (the state ``bottom`` when the stack is empty)
and continues there with the class of the token's remaining bytes, until a stay. Effects may
apply key-register ops (objects recording their written keys), which may refuse the token. A token
is allowed when that ends in a live state whose depth requirement fits the limit; EOS also needs
every state on the stack to be able to end.

>>> from jaxsample.structured import compile_gbnf, Vocabulary
>>> v = Vocabulary.from_pieces(["<eos>", "(", ")", "x", "))"], kind="raw", special_ids=[0], eos_ids=[0])
>>> m = Matcher(compile_gbnf('root ::= "x" | "(" root ")"', v))
>>> [m.accept_token(t) for t in (1, 1, 3, 4)], m.is_accepting(), m.accept_token(0), m.is_terminated()
([True, True, True, True], True, True, True)
>>> m.rollback(2); m.allowed().tolist()
[False, False, True, False, True]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxsample.structured.automaton import KeyOp
from jaxsample.structured.tokens import TokenGrammar


class Matcher:
    """Steps one output through a compiled grammar on the host (see the module docstring).

    Args:
      grammar: a compiled grammar (regular or recursive).
      max_depth: stack limit of a recursive grammar (default: the grammar's).

    Raises:
      ValueError: on a negative ``max_depth`` or one below what the grammar's shortest output needs.
    """

    def __init__(self, grammar: TokenGrammar, *, max_depth: int | None = None):
        self.grammar = grammar
        pd = grammar.pushdown
        self.limit = int(pd.max_depth if max_depth is None and pd is not None else max_depth or 0)
        if self.limit < 0 or (pd is not None and pd.need[grammar.start] > self.limit):
            raise ValueError(f"max_depth={max_depth} is negative or below what the grammar's shortest output needs")
        self.eos_ids = np.asarray(grammar.eos_ids, np.int64)
        self.vocab_size = int(grammar.class_of.shape[0])
        words = pd.key_ops.astype(object) if pd is not None else np.zeros((1, 4, 1), object)
        masks = (words << (32 * np.arange(words.shape[2], dtype=object))).sum(axis=2)
        e = (masks.shape[1] - 4) // 2
        self._ops = [KeyOp(*(int(x) for x in row[:4]), tuple(dict.fromkeys(
            (int(p), int(a)) for p, a in zip(row[4 : 4 + e], row[4 + e :]) if p or a))) for row in masks]  # fmt: skip
        if pd is not None:
            words = pd.key_need.astype(object) << (32 * np.arange(pd.key_need.shape[1], dtype=object))
            self._need = words.sum(axis=1).tolist()
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Back to the start (history cleared)."""
        self.state, self.stack, self.keys, self.terminated = int(self.grammar.start), (), 0, False
        self._history: list = []

    def rollback(self, n: int) -> None:
        """Undoes the last ``n`` accepted tokens.

        Raises:
          ValueError: if fewer than ``n`` tokens were accepted.
        """
        if not 0 <= n <= len(self._history):
            raise ValueError(f"cannot roll back {n} tokens: {len(self._history)} accepted")
        if n:
            self.state, self.stack, self.keys, self.terminated = self._history[-n]
            del self._history[-n:]

    def is_terminated(self) -> bool:
        """Whether an EOS id was accepted."""
        return self.terminated

    def is_accepting(self) -> bool:
        """Whether the output so far is complete (EOS is allowed)."""
        g = self.grammar
        return bool(g.accept[self.state]) and all(g.accept[r] for r in self.stack)

    # ------------------------------------------------------------------ masks
    def allowed(self) -> np.ndarray:
        """``bool[V]``: the tokens allowed next."""
        bits = np.unpackbits(self._words().view(np.uint8), bitorder="little")[: self.vocab_size]
        return bits.astype(bool)

    def fill_next_token_bitmask(self, bitmask: np.ndarray, index: int = 0) -> None:
        """Writes the allowed tokens into row ``index`` of an ``int32[batch, ceil(V/32)]`` bitmask."""
        words = self._words()
        if bitmask.dtype != np.int32 or bitmask.shape[-1] != words.size:
            raise ValueError(f"bitmask must be int32[..., {words.size}], got {bitmask.dtype}{list(bitmask.shape)}")
        bitmask.reshape(-1, words.size)[index] = words.view(np.int32)

    def _words(self) -> np.ndarray:
        g = self.grammar
        if self.terminated:
            return _set(np.zeros(g.masks.shape[1], np.uint32), self.eos_ids)
        words = self._base().copy()
        if g.pushdown is not None:
            words = _set(words, [t for t in self._stack_dependent() if self._step(t) is not None])
            if not all(g.accept[r] for r in self.stack):
                words = _clear(words, self.eos_ids)
        return words

    def _base(self) -> np.ndarray:
        """The bitmask of the tokens whose result does not depend on the stack (at the stack room left)."""
        g, pd = self.grammar, self.grammar.pushdown
        if pd is None:
            return g.masks[g.mask_id[self.state]]
        room = min(self.limit - len(self.stack), pd.room_mask_id.shape[1] - 1)
        return g.masks[pd.room_mask_id[self.state, max(room, 0)]]

    def _stack_dependent(self) -> list:
        pd = self.grammar.pushdown
        start = int(pd.pop_start[self.state])
        return pd.pop_token[start : start + int(pd.pop_count[self.state])].tolist()

    def _allows(self, token: int) -> bool:
        if self.terminated:
            return token in self.eos_ids
        g = self.grammar
        ok = bool(self._base()[token // 32] >> np.uint32(token % 32) & 1)
        if g.pushdown is not None:
            ok = ok or (token in self._stack_dependent() and self._step(token) is not None)
            ok = ok and (token not in self.eos_ids or all(g.accept[r] for r in self.stack))
        return ok

    # ------------------------------------------------------------------ stepping
    def accept_token(self, token: int) -> bool:
        """Advances by ``token`` if it is allowed; returns whether it was (else nothing changes)."""
        token = int(token)
        if not 0 <= token < self.vocab_size or not self._allows(token):
            return False
        self._history.append((self.state, self.stack, self.keys, self.terminated))
        if token in self.eos_ids:
            self.terminated = True
        elif self.grammar.pushdown is None:
            self.state = int(self.grammar.next[self.state, self.grammar.class_of[token]])
        else:
            self.state, self.stack, self.keys = self._step(token)
        return True

    def accept_tokens(self, tokens: Sequence[int]) -> int:
        """Accepts tokens in order until one is refused; returns how many were accepted."""
        for i, t in enumerate(tokens):
            if not self.accept_token(t):
                return i
        return len(tokens)

    def _step(self, token: int):
        """``(state, stack, keys)`` after ``token``, or ``None`` if it leads nowhere, needs too much
        depth or fails a key-register test."""
        g, pd = self.grammar, self.grammar.pushdown
        c = int(g.class_of[token])
        v = int(g.next[self.state, c])
        if pd is None:
            return (v, (), 0) if v else None
        s = g.num_states
        stack, keys = list(self.stack), self.keys
        for _ in range(pd.max_pops + 1):
            if v == 0:
                return None
            if v < s:
                ok = len(stack) + pd.need[v] <= self.limit and self._viable(v, keys)
                return (v, tuple(stack), keys) if ok else None
            target, rest, n, room = pd.effect[v - s, :4].tolist()
            keys = self._ops[int(pd.effect_op[v - s])].apply(keys)
            if len(stack) + room > self.limit or keys is None:  # (a return: calls entered and left before it)
                return None
            if target >= 0:
                if not self._viable(target, keys):
                    return None
                return target, tuple(stack) + tuple(pd.effect[v - s, 4 : 4 + n].tolist()), keys
            r = stack.pop() if stack else pd.bottom
            c = c if rest < 0 else rest
            v = int(g.next[r, c])
        return None  # pragma: no cover - chains are at most max_pops long

    def _viable(self, q: int, keys: int) -> bool:
        """Whether a key still needed in ``q`` (inside a key, after ``,``) can be written."""
        need = self._need[q]
        return not need or keys & need != need


def _set(words: np.ndarray, tokens) -> np.ndarray:
    t = np.asarray(tokens, np.int64)
    if t.size:
        np.bitwise_or.at(words, t // 32, (np.uint32(1) << (t % 32).astype(np.uint32)))
    return words


def _clear(words: np.ndarray, tokens) -> np.ndarray:
    t = np.asarray(tokens, np.int64)
    if t.size:
        np.bitwise_and.at(words, t // 32, ~(np.uint32(1) << (t % 32).astype(np.uint32)))
    return words
