"""Token tries: a vocabulary's byte strings as a prefix tree, built once per vocabulary and cached.

Nodes are numbered breadth first, the children of a node are contiguous and sorted by label, so a
frontier of nodes expands with two gathers and one ``repeat``. Besides the byte trie a vocabulary
keeps *quotient* tries under byte partitions: the trie of the tokens' strings of blocks, where all
bytes of a block are one letter. Inside a JSON string, for instance, every printable ASCII byte
behaves the same, and the ~170k-node byte trie of a 32k vocabulary collapses to ~3k nodes. Quotients
are cached per partition (the same partitions recur across schemas), with the map from byte-trie
nodes to quotient nodes and its inverse (the byte nodes a quotient node stands for).

Where :func:`~jaxsample.structured.grammar_cache.set_directory` names a directory, the analysis is
kept there too (``*.vocab`` files keyed by the token bytes' digest and the compiler's sources: the
byte trie with its chains, each quotient and the suffix ids as first built), and a new process reads
it instead of building it (at V=128k a regular schema's first compile takes ~0.3 s instead of ~1.9 s:
``benchmarks/vocab_cache.py``).

>>> from jaxsample.structured.vocab import Vocabulary
>>> v = Vocabulary.from_pieces(["<eos>", "ab", "ac", "b"], kind="raw", special_ids=[0], eos_ids=[0])
>>> t = vocab_index(v).trie
>>> t.label.tolist(), t.term.tolist()
([-1, 97, 98, 98, 99], [-1, -1, 2, 0, 1])
"""

from __future__ import annotations

import collections
import functools
import hashlib
import pickle
from typing import NamedTuple

import numpy as np

from jaxsample.structured import grammar_cache
from jaxsample.structured.minimise import unique_rows

#: Quotient tries kept per vocabulary: at least this many (each costs a few MiB at V=128k) ...
MAX_QUOTIENTS = 32
#: ... and more while they hold fewer bytes than this (~0.35 MiB each at V=8k: a recursive schema can
#: use 30 partitions of its own, which would otherwise evict the string-body partitions every schema shares).
MAX_QUOTIENT_BYTES = 64 << 20


class Trie(NamedTuple):
    """A prefix tree in breadth-first order (node 0 is the root, the empty prefix).

    Attributes:
      label: ``int32[N]`` letter on the edge into each node (``-1`` for the root).
      first: ``int32[N]`` index of the first child (children are contiguous, sorted by label).
      count: ``int32[N]`` number of children.
      term: ``int32[N]`` string ending at the node (an index into the vocabulary's strings), ``-1`` if none.
      depth_start: ``int64[D + 2]`` first node of each depth (depth ``d`` nodes are ``[depth_start[d], depth_start[d+1])``).
      root_weight: ``int64[A]`` size of the subtrie under each first letter (a bound on walk work).
    """

    label: np.ndarray
    first: np.ndarray
    count: np.ndarray
    term: np.ndarray
    depth_start: np.ndarray
    root_weight: np.ndarray

    @property
    def size(self) -> int:
        return int(self.label.shape[0])


class Chains(NamedTuple):
    """The unary paths of a trie: below a node with one child, down to the first node that branches or ends.

    A walker whose state loops on every label of such a path (inside a string body, say, on a long
    run of punctuation) can jump to its end at once, ending every token on the way in its state.

    Attributes:
      end: ``int32[N]`` last node of the path below each node (the node itself when it has no path).
      mask: ``uint64[N, W]`` the labels on the path, one bit each.
      hit_lo, hit_hi: ``int64[N]``: the tokens ending on the path are ``term_node[hit_lo:hit_hi]``.
      term_node: ``int32[T]`` the terminal nodes in pre-order (a subtrie's terminals are contiguous).
    """

    end: np.ndarray
    mask: np.ndarray
    hit_lo: np.ndarray
    hit_hi: np.ndarray
    term_node: np.ndarray


def _into_parents(ufunc: np.ufunc, out: np.ndarray, parent: np.ndarray, values: np.ndarray) -> None:
    """``out[p] = ufunc(out[p], ufunc of the values of p's children)`` for the nodes of one level
    (children are contiguous, so their parents come in runs: ``reduceat``, not the slow ``ufunc.at``)."""
    if parent.size:
        starts = np.flatnonzero(np.concatenate([[True], parent[1:] != parent[:-1]]))
        p = parent[starts]
        out[p] = ufunc(out[p], ufunc.reduceat(values, starts))


def chains(t: Trie, alphabet: int, from_depth: int = 0) -> Chains:
    """:class:`Chains` of a trie over ``alphabet`` labels; paths start at depth ``from_depth`` or deeper."""
    n = t.size
    parent = np.full(n, -1, np.int64)
    parent[1:] = np.repeat(np.arange(n), t.count)
    ds = t.depth_start
    size = np.ones(n, np.int64)
    for d in range(ds.size - 2, 0, -1):  # subtrie sizes, deepest level first
        a, b = int(ds[d]), int(ds[d + 1])
        _into_parents(np.add, size, parent[a:b], size[a:b])
    rank = np.zeros(n, np.int64)  # pre-order rank: first child after its parent, then siblings by size
    for d in range(1, ds.size - 1):
        a, b = int(ds[d]), int(ds[d + 1])
        before = np.cumsum(size[a:b]) - size[a:b]  # sizes of the earlier nodes of the level
        rank[a:b] = rank[parent[a:b]] + 1 + before - before[t.first[parent[a:b]] - a]
    words = -(-alphabet // 64)
    end = np.arange(n, dtype=np.int64)
    mask = np.zeros((n, words), np.uint64)
    unary = t.count == 1
    for d in range(ds.size - 2, -1, -1):  # deepest level first: a path continues through its child's
        a, b = int(ds[d]), int(ds[d + 1])
        nodes = np.arange(a, b)[unary[a:b] & (d >= from_depth)]
        if nodes.size == 0:
            continue
        child = t.first[nodes].astype(np.int64)
        through = unary[child]
        end[nodes] = np.where(through, end[child], child)
        lab = t.label[child].astype(np.int64)
        bit = np.zeros((nodes.size, words), np.uint64)
        bit[np.arange(nodes.size), lab // 64] = np.uint64(1) << (lab % 64).astype(np.uint64)
        mask[nodes] = bit | np.where(through[:, None], mask[child], np.uint64(0))
    term_node = np.flatnonzero(t.term >= 0)
    term_node = term_node[np.argsort(rank[term_node], kind="stable")]
    t_rank = rank[term_node]
    has = end != np.arange(n)
    child = np.where(has, t.first, 0).astype(np.int64)
    hit_lo = np.where(has, np.searchsorted(t_rank, rank[child]), 0)
    hit_hi = np.where(has, np.searchsorted(t_rank, rank[end] + 1), 0)
    return Chains(end.astype(np.int32), mask, hit_lo, hit_hi, term_node.astype(np.int32))


class Quotient(NamedTuple):
    """The trie of a vocabulary under a byte partition (see the module docstring).

    The first ``exact_depth`` letters of a token may be kept as bytes (labels ``0..255`` there):
    a state that needs exact first bytes but is followed by states constant on the blocks (an
    escape ``\\`` inside a string) then walks few nodes.

    Attributes:
      trie: the quotient trie (labels are block ids, bytes up to ``exact_depth``).
      exact_depth: how many leading letters are bytes.
      blocks: ``int32[256]`` block of every byte.
      representative: ``int32[num_blocks]`` one byte of each block.
      of_byte_node: ``int32[N_bytes]`` quotient node of every byte-trie node.
      members_start: ``int64[N + 1]``; byte-trie nodes of quotient node ``m`` are
        ``members[members_start[m]:members_start[m + 1]]``.
      members: ``int32[N_bytes]`` byte-trie nodes grouped by quotient node.
      terminal: ``int32[N]`` index of each terminal quotient node among the terminal ones, ``-1`` elsewhere.
      string_terminal: ``int32[U]`` terminal index of the quotient node where each string ends.
      chains: the quotient trie's :class:`Chains` (below ``exact_depth``, over blocks).
    """

    trie: Trie
    exact_depth: int
    blocks: np.ndarray
    representative: np.ndarray
    of_byte_node: np.ndarray
    members_start: np.ndarray
    members: np.ndarray
    terminal: np.ndarray
    string_terminal: np.ndarray
    chains: Chains

    @property
    def num_terminals(self) -> int:
        return int(self.terminal.max()) + 1 if self.terminal.size else 0


def _make_trie(label, parent, term, depth_start, alphabet: int) -> Trie:
    count = np.bincount(parent[1:], minlength=label.size).astype(np.int32)
    first = (np.cumsum(count) - count + 1).astype(np.int32)
    size = np.ones(label.size, np.float64)
    for d in range(len(depth_start) - 2, 0, -1):  # deepest level first: subtrie sizes
        up, lo, hi = depth_start[d - 1], depth_start[d], depth_start[d + 1]
        size[up:lo] += np.bincount(parent[lo:hi] - up, weights=size[lo:hi], minlength=lo - up)
    weight = np.zeros(alphabet, np.int64)
    kids = np.arange(first[0], first[0] + count[0])
    weight[label[kids]] = size[kids]
    return Trie(label.astype(np.int32), first, count, term.astype(np.int32), np.asarray(depth_start, np.int64), weight)


class VocabIndex:
    """Per-vocabulary preprocessing shared by every grammar compiled for it.

    Attributes:
      strings: the distinct byte strings of the text tokens, sorted (``U`` of them).
      token_ids: ``int64[T]`` ids of the text tokens (tokens with bytes).
      string_of_token: ``int32[T]`` string index of each text token.
      lengths: ``int64[U]`` byte length of each string.
      trie: the byte trie of ``strings``.
      end: ``int32[U]`` node where each string ends.
      single_byte: ``bool[256]`` bytes that are a token on their own.
      byte_weight: ``float64[256]`` share of trie edges carrying each byte (how much walking a byte opens).
    """

    def __init__(self, token_bytes):
        ids = [i for i, b in enumerate(token_bytes) if b]
        blobs = [token_bytes[i] for i in ids]
        strings = sorted(set(blobs))
        where = {s: i for i, s in enumerate(strings)}
        self.strings = tuple(strings)
        self.token_ids = np.asarray(ids, np.int64)
        self.string_of_token = np.asarray([where[b] for b in blobs], np.int32)
        self.lengths = np.fromiter((len(s) for s in strings), np.int64, len(strings))
        self.trie, self.end = _byte_trie(strings)
        self.single_byte = np.zeros(256, bool)
        self.single_byte[[s[0] for s in strings if len(s) == 1]] = True
        self._derived()

    def _derived(self) -> None:
        """The fields computed from the stored ones (after building or reading from disk)."""
        edges = np.bincount(self.trie.label[1:], minlength=256).astype(np.float64)
        self.byte_weight = edges / max(edges.sum(), 1.0)
        self._quotients: collections.OrderedDict = collections.OrderedDict()
        self._quotient_bytes = 0
        self.disk_key: tuple | None = None  # set by vocab_index: its quotients and suffixes are kept on disk
        # parent of every byte-trie node, needed to build quotients
        t = self.trie
        self._parent = np.full(t.size, -1, np.int32)
        self._parent[1:] = np.repeat(np.arange(t.size, dtype=np.int32), t.count)

    def arrays(self) -> dict:
        """The index as named arrays (its byte trie's :attr:`chains` included), for the on-disk cache."""
        out = {"token_ids": self.token_ids, "string_of_token": self.string_of_token, "lengths": self.lengths,
               "end": self.end, "single_byte": self.single_byte, "flat": self.flat}  # fmt: skip
        return {**out, **_flatten("trie.", self.trie), **_flatten("chains.", self.chains)}

    @classmethod
    def from_arrays(cls, arrays: dict) -> "VocabIndex":
        """The index stored by :meth:`arrays` (``KeyError`` if a field is missing)."""
        self = cls.__new__(cls)
        for name in ("token_ids", "string_of_token", "lengths", "end", "single_byte", "flat"):
            self.__dict__[name] = arrays[name]
        self.trie = _unflatten(Trie, arrays, "trie.")
        self.__dict__["chains"] = _unflatten(Chains, arrays, "chains.")
        self._derived()
        return self

    @functools.cached_property
    def flat(self) -> np.ndarray:
        """``uint8[sum(lengths)]``: the strings' bytes concatenated."""
        return np.frombuffer(b"".join(self.strings), np.uint8)

    @functools.cached_property
    def strings(self) -> tuple:
        """The distinct byte strings of the text tokens, sorted (set when built; from :attr:`flat` when read)."""
        data, ends = self.flat.tobytes(), np.cumsum(self.lengths).tolist()
        return tuple(data[a:b] for a, b in zip([0] + ends[:-1], ends))

    @functools.cached_property
    def chains(self) -> Chains:
        """The byte trie's :class:`Chains` (built on first use)."""
        return chains(self.trie, 256)

    @functools.cached_property
    def suffixes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(flat, offset, suffix, first)``: the strings' bytes concatenated (``strings[u]`` starts at
        ``offset[u]``); the suffix of ``strings[u]`` from byte ``k`` has id ``suffix[offset[u] + k]``
        (equal suffixes share an id: hashed from the right, verified byte by byte); ``first[i]`` is
        the position of suffix ``i``'s first occurrence. Built on first use (recursive grammars)."""
        flat = self.flat.astype(np.int64)
        offset = np.cumsum(self.lengths) - self.lengths
        suffix, first = self._kept(("suffixes",), lambda: _suffix_ids(flat, offset, self.lengths), _SuffixIds)
        return flat, offset, suffix, first

    @functools.cached_property
    def subtree(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(lo, hi, depth)`` per byte-trie node: the strings below it are ``strings[lo:hi]`` (sorted
        strings make them contiguous); ``depth`` is the node's length in bytes."""
        t = self.trie
        big = self.lengths.size
        lo = np.where(t.term >= 0, t.term, big).astype(np.int64)
        hi = np.where(t.term >= 0, t.term + 1, 0).astype(np.int64)
        ds = t.depth_start
        for d in range(ds.size - 2, 0, -1):  # deepest level first
            a, b = int(ds[d]), int(ds[d + 1])
            _into_parents(np.minimum, lo, self._parent[a:b], lo[a:b])
            _into_parents(np.maximum, hi, self._parent[a:b], hi[a:b])
        depth = np.repeat(np.arange(ds.size - 1), np.diff(ds))
        return lo, hi, depth

    def quotient(self, blocks: np.ndarray, exact_depth: int = 0) -> Quotient:
        """The quotient trie under the byte partition ``blocks`` (``int[256]`` block ids), cached."""
        blocks = np.asarray(blocks, np.int64)
        _, first_seen, canon = np.unique(blocks, return_index=True, return_inverse=True)
        order = np.argsort(np.argsort(first_seen))  # canonical labels: blocks numbered by first byte
        canon = order[canon.reshape(-1)].astype(np.int32)
        key = (canon.astype(np.uint8).tobytes(), int(exact_depth))
        hit = self._quotients.get(key)
        if hit is None:
            part = ("quotient", key[0].hex(), key[1])
            hit = self._quotients[key] = self._kept(part, lambda: _quotient(self, canon, int(exact_depth)), Quotient)
            self._quotient_bytes += _nbytes(hit)
            while len(self._quotients) > MAX_QUOTIENTS and self._quotient_bytes > MAX_QUOTIENT_BYTES:
                self._quotient_bytes -= _nbytes(self._quotients.popitem(last=False)[1])
        else:
            self._quotients.move_to_end(key)
        return hit

    def _kept(self, part: tuple, build, cls):
        """``build()`` (a named tuple ``cls`` of arrays), or the one kept on disk under this index's key
        and ``part`` (where what is built is stored, when a directory is set; see :func:`vocab_index`)."""
        if self.disk_key is None:
            return build()
        key = (*self.disk_key, *part)
        out = grammar_cache.load_vocab_part(key, lambda arrays: _unflatten(cls, arrays, ""))
        if out is None:
            out = build()
            grammar_cache.store_vocab_part(key, lambda: _flatten("", out))
        return out


class _SuffixIds(NamedTuple):
    """:attr:`VocabIndex.suffixes`' ids (``int64[sum(lengths)]``) and first occurrences (``int64[I]``)."""

    suffix: np.ndarray
    first: np.ndarray


def _suffix_ids(flat: np.ndarray, offset: np.ndarray, lengths: np.ndarray) -> _SuffixIds:
    """``(suffix, first)`` of :attr:`VocabIndex.suffixes` for the strings ``flat[offset[u]:][:lengths[u]]``.

    Shortest suffixes first: a suffix of length ``k > 1`` is its first byte and a suffix of length
    ``k - 1`` already numbered, so equal suffixes are equal ``(byte, id)`` pairs (exact, no hashing).
    """
    owner = np.repeat(np.arange(lengths.size), lengths)
    rem = (offset + lengths)[owner] - np.arange(flat.size)  # bytes from each position to its end
    order = np.argsort(rem, kind="stable")  # by length, then position
    bounds = np.searchsorted(rem[order], np.arange(1, int(rem.max(initial=0)) + 2))
    suffix = np.zeros(flat.size, np.int64)
    firsts, count = [], 0
    for r in range(bounds.size - 1):
        at = order[bounds[r] : bounds[r + 1]]
        key = flat[at] if r == 0 else flat[at] * (count + 1) + suffix[at + 1]
        _, where, ids = np.unique(key, return_index=True, return_inverse=True)
        suffix[at] = ids.reshape(-1) + count
        firsts.append(at[where])  # (the lowest position: ``at`` is in position order)
        count += where.size
    first = np.concatenate(firsts) if firsts else np.zeros(0, np.int64)
    return _SuffixIds(suffix, first)


def _flatten(prefix: str, tup: tuple) -> dict:
    """The arrays of a (nested) named tuple by dotted name (integers as 0-d arrays)."""
    out = {}
    for name, value in tup._asdict().items():
        if isinstance(value, tuple):
            out.update(_flatten(f"{prefix}{name}.", value))
        else:
            out[prefix + name] = np.asarray(value)
    return out


def _unflatten(cls, arrays: dict, prefix: str):
    """The named tuple ``cls`` from :func:`_flatten`'s arrays (``KeyError`` if one is missing)."""
    nested = {"trie": Trie, "chains": Chains}
    fields = {}
    for name in cls._fields:
        if name in nested:
            fields[name] = _unflatten(nested[name], arrays, f"{prefix}{name}.")
        else:
            a = arrays[prefix + name]
            fields[name] = int(a) if a.ndim == 0 else a
    return cls(**fields)


def _nbytes(x) -> int:
    """Bytes of the arrays in a (nested) named tuple."""
    return x.nbytes if isinstance(x, np.ndarray) else sum(map(_nbytes, x)) if isinstance(x, tuple) else 0


def _byte_trie(strings: list[bytes]) -> tuple[Trie, np.ndarray]:
    """Breadth-first trie of sorted distinct strings, from longest common prefixes of neighbours."""
    u = len(strings)
    lengths = np.fromiter((len(s) for s in strings), np.int64, u)
    width = int(lengths.max()) if u else 0
    mat = np.zeros((u, width), np.uint8)
    if u:
        flat = np.frombuffer(b"".join(strings), np.uint8)
        row = np.repeat(np.arange(u), lengths)
        col = np.arange(flat.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        mat[row, col] = flat
    lcp = np.zeros(u, np.int64)  # with the previous string
    if u > 1:
        same = np.cumprod(mat[1:] == mat[:-1], axis=1, dtype=np.int8).sum(axis=1)
        lcp[1:] = np.minimum(same, np.minimum(lengths[1:], lengths[:-1]))
    labels, parents, terms, depth_start = [np.array([-1], np.int32)], [], [np.array([-1], np.int32)], [0, 1]
    live = np.arange(u)  # the strings at least d bytes long, in order
    node = np.zeros(u, np.int64)  # node of each live string at the previous depth
    end = np.zeros(u, np.int32)
    base = 1
    for d in range(1, width + 1):
        keep = lengths[live] >= d
        live, node = live[keep], node[keep]
        new = lcp[live] < d  # a new node where the string leaves its predecessor's path
        n_new = int(new.sum())
        parents.append(node[new].astype(np.int32))
        node = np.cumsum(new) - 1 + base
        labels.append(mat[live[new], d - 1].astype(np.int32))
        term = np.full(n_new, -1, np.int32)
        ends = np.flatnonzero(lengths[live] == d)
        term[node[ends] - base] = live[ends]
        end[live[ends]] = node[ends]
        terms.append(term)
        base += n_new
        depth_start.append(base)
    parent = np.concatenate([np.array([-1], np.int32)] + parents)
    return _make_trie(np.concatenate(labels), parent, np.concatenate(terms), depth_start, 256), end


def _quotient(index: VocabIndex, blocks: np.ndarray, exact_depth: int) -> Quotient:
    """Quotient of the byte trie: level by level, nodes are distinct (quotient parent, letter) pairs."""
    t = index.trie
    nb = int(blocks.max()) + 1
    identity = np.arange(256, dtype=np.int64)
    of_byte = np.zeros(t.size, np.int64)
    labels, parents, depth_start = [np.array([-1], np.int64)], [np.array([-1], np.int64)], [0, 1]
    base = 1
    ds = t.depth_start
    for d in range(1, ds.size - 1):
        lo, hi = int(ds[d]), int(ds[d + 1])
        if hi == lo:
            break
        letters, n = (identity, 256) if d <= exact_depth else (blocks, nb)
        key = of_byte[index._parent[lo:hi]] * n + letters[t.label[lo:hi]]
        uniq, inv = np.unique(key, return_inverse=True)
        of_byte[lo:hi] = inv.reshape(-1) + base
        parents.append(uniq // n)
        labels.append(uniq % n)
        base += uniq.size
        depth_start.append(base)
    label = np.concatenate(labels)
    parent = np.concatenate(parents)
    is_term = np.zeros(label.size, bool)
    is_term[of_byte[t.term >= 0]] = True
    terminal = np.where(is_term, np.cumsum(is_term) - 1, -1).astype(np.int32)
    order = np.argsort(of_byte, kind="stable").astype(np.int32)
    members_start = np.searchsorted(of_byte[order], np.arange(label.size + 1))
    representative = np.zeros(nb, np.int32)
    representative[blocks[::-1]] = np.arange(255, -1, -1, dtype=np.int32)
    qt = _make_trie(label, parent, terminal, depth_start, 256 if exact_depth else nb)
    return Quotient(
        trie=qt,
        exact_depth=exact_depth,
        blocks=blocks.astype(np.int32),
        representative=representative,
        of_byte_node=of_byte.astype(np.int32),
        members_start=members_start,
        members=order,
        terminal=terminal,
        string_terminal=terminal[of_byte[index.end]],
        chains=chains(qt, nb, exact_depth + 1),
    )


def _digest(token_bytes: tuple) -> str:
    """Content hash of a vocabulary's token bytes (``None`` entries included)."""
    return hashlib.blake2b(pickle.dumps(tuple(token_bytes), protocol=5), digest_size=20).hexdigest()


@functools.lru_cache(maxsize=8)
def _cached_index(token_bytes: tuple) -> VocabIndex:
    """Built, or read from the on-disk cache when :func:`~jaxsample.structured.grammar_cache.set_directory`
    names one (keyed by the token bytes' digest; the byte trie's chains are stored with it)."""
    key = ("vocab_index", _digest(token_bytes))
    index = grammar_cache.load_vocab_part(key, VocabIndex.from_arrays)  # (None without a directory)
    if index is None:
        index = VocabIndex(token_bytes)
        grammar_cache.store_vocab_part(key, index.arrays)
    index.disk_key = key  # its quotients too, whenever a directory is set
    return index


def vocab_index(vocab) -> VocabIndex:
    """The (cached) :class:`VocabIndex` of a :class:`~jaxsample.structured.vocab.Vocabulary`."""
    return _cached_index(vocab.token_bytes)
