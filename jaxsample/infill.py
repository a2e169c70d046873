"""llama.cpp ``infill`` (fill-in-the-middle) sampler on fixed-shape masked logits.

Upstream (``llama_sampler_infill_apply``), over the ``N`` current candidates sorted by logit:

1. ``p = softmax``; ``p_eog`` / ``p_txt`` = probability of end-of-generation (EOG) / other tokens.
2. If ``3 * p_eog * N > p_txt``: keep only the EOG tokens.
3. Merge tokens with a common prefix: for every ordered pair (``i0``, ``i1``) whose piece
   ``piece(i0)`` (non-empty) is a prefix of ``piece(i1)``, the less probable of the two (the
   longer one on ties) gives its probability to the other and is removed. The pairs are visited
   sequentially, ``i0`` in descending order, and probabilities accumulate as they go.
4. Drop non-EOG tokens with merged ``p < 0.2``; if none is left, the only candidate is EOT
   (logit 1).
5. Renormalise; drop non-EOG tokens with ``p < 1 / (n_non_eog + 1)``.

The survivors keep their original logits (the merged probabilities only decide who survives;
llama.cpp's next sampler recomputes the softmax from the logits).

**Parallel form of step 3.** Call ``d`` a *descendant* of ``a`` when ``piece(a)`` is a non-empty
prefix of ``piece(d)`` (identical pieces: the lower id is the ancestor). A token *dominates* when
it is at least as probable as every descendant; the *survivors* are the dominant tokens with no
dominant ancestor. Unless two related tokens are exactly equally probable, the sequential merge
leaves exactly the survivors, each token's probability ending in its surviving ancestor if it has
one, else in its most probable surviving descendant. Sketch, by induction over the visiting
order: a token cannot gain mass before its own turn (the ancestors visiting it earlier are at
least as probable), so at its turn a live token holds its own ``p``; if it dominates, every live
descendant comes later, is less probable and is absorbed; otherwise its first live descendant in
visiting order is its most probable descendant (alive: only a dominant ancestor could have
absorbed it, and that one would have absorbed this token too), which takes its mass. Survivors
are never absorbed later. The tests check this against a transcription of the C++ loop.

Each quantity is one gather or scatter over the ancestor/descendant edge list built on the host
by :func:`infill_table`, so the step costs ``O(B * (V + E))`` with ``E`` about ``V`` times the
average number of vocabulary prefixes of a token (4.2 for a synthetic 128k BPE-like vocabulary).
Under exact ties between related tokens llama.cpp's result depends on its unstable sort; here the
ancestor wins ties and among equally probable survivors the lowest id receives the mass.

``N`` is the number of finite logits (the candidates a truncating llama.cpp sampler would have
left). Removed (``-inf``) tokens take no part, as upstream skips them.

The stage :class:`Infill` holds its table as static data; stages compare by the table's content.

Sharding/TPU: rows are independent; shard the batch axis. The table is replicated; the merge is
a gather and a scatter over the edge list per row; no batch-level branch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from jaxsample import _math, _validate
from jaxsample._byte_level import unicode_to_byte
from jaxsample._types import NEG_INF, Array, ArrayLike, Float
from jaxsample.chain import Stage

#: Step-4 threshold on the merged probability of a non-EOG token.
MERGED_THRESHOLD = 0.2


class InfillTable(NamedTuple):
    """Vocabulary data of the infill sampler (a pytree of arrays, built once per tokenizer)."""

    ancestor: Array  # int32[E]: piece(ancestor) is a non-empty prefix of piece(descendant); V = padding
    descendant: Array  # int32[E]
    is_eog: Array  # bool[V]: end-of-generation tokens
    fallback: Array  # int32[]: the token left when no text token survives (EOT, else EOS)


def infill_table(
    pieces: Sequence[str | bytes],
    eog_ids: Sequence[int],
    *,
    fallback_id: int | None = None,
    vocab_size: int | None = None,
) -> InfillTable:
    """Builds the infill table from each token's piece (host side, once per vocabulary).

    Args:
      pieces: the text of every token as llama.cpp's ``token_to_piece(id, special=false)``
        renders it: bytes, or ``str`` (UTF-8 encoded). Control tokens render as empty pieces.
      eog_ids: end-of-generation ids (EOS, EOT, EOM, FIM pad/sep... = llama.cpp ``is_eog``).
      fallback_id: the token to return when no text token survives; llama.cpp uses EOT (or EOS).
        Defaults to ``eog_ids[0]``.
      vocab_size: logits width ``V >= len(pieces)`` (padded vocabularies); extra ids get empty pieces.

    Returns:
      An :class:`InfillTable` for :func:`infill`.

    Raises:
      ValueError: on an empty ``eog_ids``, or an id outside ``[0, V)``.

    >>> t = infill_table(["a", "ab", "b", ""], eog_ids=[3])
    >>> list(zip(t.ancestor.tolist(), t.descendant.tolist()))
    [(0, 1)]
    """
    raw = [p.encode("utf-8") if isinstance(p, str) else bytes(p) for p in pieces]
    v = _validate.static_int(len(raw) if vocab_size is None else vocab_size, "vocab_size", lo=max(1, len(raw)))
    eog = [int(i) for i in eog_ids]
    if not eog:
        raise ValueError("eog_ids must list at least one end-of-generation id")
    fallback = eog[0] if fallback_id is None else int(fallback_id)
    for name, ids in (("eog_ids", eog), ("fallback_id", [fallback])):
        if min(ids) < 0 or max(ids) >= v:
            raise ValueError(f"{name} must be token ids in [0, {v}), got {ids}")
    by_piece: dict[bytes, list[int]] = {}
    for i, s in enumerate(raw):
        if s:
            by_piece.setdefault(s, []).append(i)
    anc, desc = [], []
    for d, s in enumerate(raw):
        for length in range(1, len(s) + 1):
            for a in by_piece.get(s[:length], ()):
                if a != d and (length < len(s) or a < d):
                    anc.append(a)
                    desc.append(d)
    is_eog = np.zeros(v, bool)
    is_eog[eog] = True
    return InfillTable(
        ancestor=jnp.asarray(np.asarray(anc, np.int32)),
        descendant=jnp.asarray(np.asarray(desc, np.int32)),
        is_eog=jnp.asarray(is_eog),
        fallback=jnp.asarray(fallback, jnp.int32),
    )


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_pieces(tokenizer, vocab_size: int | None = None) -> list[bytes]:
    """Each token's bytes from a HuggingFace ``tokenizers.Tokenizer``, as llama.cpp renders pieces.

    Byte-level BPE (GPT-2 / Llama-3 style, ``ByteLevel`` decoder): the byte alphabet is inverted.
    Otherwise (SentencePiece style): ``▁`` is a space and ``<0xHH>`` byte-fallback tokens are that
    byte. Special added tokens render empty (``special=false``); other added tokens as their text.
    """
    spec = json.loads(tokenizer.to_str())
    byte_level = '"ByteLevel"' in json.dumps(spec.get("decoder"))
    decoder = unicode_to_byte()
    added = tokenizer.get_added_tokens_decoder()
    n = tokenizer.get_vocab_size(with_added_tokens=True) if vocab_size is None else vocab_size
    out = []
    for i in range(n):
        tok = tokenizer.id_to_token(i)
        if tok is None or (i in added and added[i].special):
            out.append(b"")
        elif i in added:
            out.append(tok.encode("utf-8"))
        elif byte_level and all(c in decoder for c in tok):
            out.append(bytes(decoder[c] for c in tok))
        elif m := _BYTE_TOKEN.fullmatch(tok):
            out.append(bytes([int(m.group(1), 16)]))
        else:
            out.append(tok.replace("\u2581", " ").encode("utf-8"))
    return out


def infill_table_from_tokenizer(
    tokenizer, eog_ids: Sequence[int], *, fallback_id: int | None = None, vocab_size: int | None = None
) -> InfillTable:
    """:func:`infill_table` from a HuggingFace ``tokenizers.Tokenizer`` (see :func:`token_pieces`)."""
    pieces = token_pieces(tokenizer)
    return infill_table(pieces, eog_ids, fallback_id=fallback_id, vocab_size=vocab_size)


def _take(values: Array, ids: Array, fill) -> Array:
    """``values[ids]`` along the leading (vocabulary) axis; out-of-range (padding) ids read ``fill``."""
    return jnp.take(values, ids, axis=0, mode="fill", fill_value=fill)


def _merge(p: Array, finite: Array, table: InfillTable) -> tuple[Array, Array]:
    """Step 3 in closed form: ``(merged probability, survivor mask)``, both ``[V, R]``.

    Vocabulary-major layout: every scatter writes whole ``[R]`` rows at an edge's token, which
    XLA vectorises (a batch-minor scatter ``[R, V].at[:, ids]`` is many times slower on CPU).
    """
    vocab, rows = p.shape
    anc, desc = table.ancestor, table.descendant
    p_desc = _take(p, desc, 0.0)
    live = _take(finite, anc, False) & _take(finite, desc, False)

    def scatter(init, dtype, ids, vals, op):
        return getattr(jnp.full((vocab, rows), init, dtype).at[ids], op)(vals, mode="drop")

    most = scatter(-1.0, jnp.float32, anc, jnp.where(live, p_desc, -1.0), "max")
    dominant = finite & (p >= most)
    below = scatter(0, jnp.int32, desc, (live & _take(dominant, anc, False)).astype(jnp.int32), "max")
    survivor = dominant & (below == 0)
    to_anc = live & _take(survivor, anc, False)
    to_desc = live & _take(survivor, desc, False)
    root = scatter(-1, jnp.int32, desc, jnp.where(to_anc, anc[:, None], -1), "max")
    best_p = scatter(-1.0, jnp.float32, anc, jnp.where(to_desc, p_desc, -1.0), "max")
    is_best = to_desc & (p_desc == _take(best_p, anc, -1.0))
    best = scatter(vocab, jnp.int32, anc, jnp.where(is_best, desc[:, None], vocab), "min")
    own = jnp.arange(vocab)[:, None]
    target = jnp.where(root >= 0, root, jnp.where(survivor, own, best))
    mass = jnp.zeros_like(p).at[target, jnp.arange(rows)].add(p, mode="drop")
    return mass, survivor


def infill(logits: Float["*B V"], table: InfillTable) -> Float["*B V"]:
    """llama.cpp ``infill``: EOG-or-text decision, prefix merge and thresholds (see the module doc).

    Args:
      logits: ``[..., V]`` float32 or bfloat16 (NaN counts as ``-inf``).
      table: from :func:`infill_table` / :func:`infill_table_from_tokenizer` for this vocabulary.

    Returns:
      ``[..., V]`` in the input dtype: surviving tokens keep their logits, the rest are ``-inf``;
      a row where no text token survives holds only ``table.fallback`` at logit 1. All ``-inf``
      rows are returned unchanged.

    Raises:
      ValueError: if the table was built for another vocabulary size.

    >>> import jax, jax.numpy as jnp
    >>> t = infill_table(["a", "ab", "c", ""], eog_ids=[3])
    >>> x = jnp.log(jnp.array([0.25, 0.3, 0.4, 0.05]))   # "a" merges into "ab" (p = 0.55)
    >>> (jax.jit(infill)(x, t) > -jnp.inf).tolist()
    [False, True, True, True]
    """
    x, dtype = _math.prepare(logits)
    return _math.restore(_infill(x, table), dtype)


def _infill(x: Array, table: InfillTable) -> Array:
    """The core on NaN-free float32 ``x [*B, V]``."""
    shape, vocab = x.shape, x.shape[-1]
    if table.is_eog.shape != (vocab,):
        raise ValueError(f"table was built for vocab size {table.is_eog.shape[-1]}, logits have V = {vocab}")
    x = x.reshape(-1, vocab)
    eog = table.is_eog
    finite = x > NEG_INF
    p = _math.softmax(x)
    n = _math.row_count(finite, keepdims=True).astype(jnp.float32)
    p_eog = _math.row_sum(jnp.where(eog, p, 0.0), keepdims=True)
    p_txt = _math.row_sum(jnp.where(eog, 0.0, p), keepdims=True)
    eog_only = _math.keep(x, eog)

    mass, survivor = (a.T for a in _merge(p.T, finite.T, table))
    keep = jnp.where(eog, survivor, survivor & (mass >= MERGED_THRESHOLD))
    n_text = _math.row_count(keep & ~eog, keepdims=True)
    q = mass / _math.row_sum(jnp.where(keep, mass, 0.0), keepdims=True)
    keep = keep & (eog | (q >= 1.0 / (n_text + 1).astype(jnp.float32)))
    fallback = jnp.where(jnp.arange(vocab) == table.fallback, 1.0, NEG_INF)
    merged = jnp.where(n_text > 0, _math.keep(x, keep), fallback)

    out = jnp.where(3.0 * p_eog * n > p_txt, eog_only, merged)
    out = jnp.where(jnp.any(finite, axis=-1, keepdims=True), out, x)
    return out.reshape(shape)


def _digest(table: InfillTable) -> str:
    """sha256 of a table's arrays: its identity as static data."""
    h = hashlib.sha256()
    for a in table:
        a = np.asarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class Infill(Stage):
    """llama.cpp ``infill`` (:func:`infill`) with a vocabulary table fixed at build time.

    Stages with tables of equal content are equal (they share compilations).
    """

    table: InfillTable = dataclasses.field(compare=False)
    _: dataclasses.KW_ONLY
    name: str = "infill"
    digest: str = dataclasses.field(default="", init=False)

    def __post_init__(self):
        if not isinstance(self.table, InfillTable):
            got = type(self.table).__name__
            raise ValueError(f"table must be an InfillTable (build it with infill_table), got {got}")
        object.__setattr__(self, "digest", _digest(self.table))
        super().__post_init__()

    def update(self, x, state, params, info):
        return _infill(x, self.table), state
