"""``python -m jaxsample showcase``: what each preset chain does to a real next-word distribution.

The distribution is the smoothed bigram model of :mod:`jaxsample._corpus` (the words of Python's
reference documentation, ``V`` about 3.4k) after the last word of ``context``; the whole context is
the history that penalties and DRY see. For every sampler config the chain's stages are applied
(:meth:`jaxsample.Sampler.process`) and the report shows how many words survive, the entropy
before and after, the most probable survivors, and ``samples`` draws (one per seed, through the
chain's selector, so mirostat's own truncation shows in the draws only).

Config kind ``showcase``: ``context``, ``samplers`` (names in ``configs/samplers`` or paths),
``samples``, ``top``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

KIND = "showcase"
DEFAULT_SAMPLERS = ("vllm", "hf", "top_p", "min_p", "llama_cpp", "dry", "mirostat", "code", "technical_writing",
                    "creative", "chat", "brainstorming")


@dataclasses.dataclass(frozen=True)
class ShowcaseConfig:
    """See the module docstring."""

    context: str = "the value of the"
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    samples: int = 8
    top: int = 5

    def __post_init__(self):
        if not self.context.split():
            raise ValueError("context must hold at least one word")
        if not self.samplers:
            raise ValueError("samplers must name at least one sampler config")
        if self.samples < 1 or self.top < 1:
            raise ValueError(f"samples and top must be >= 1, got {self.samples}, {self.top}")


def load(path: str | None, overrides=()) -> ShowcaseConfig:
    from jaxsample import config as _config

    return _config.load(ShowcaseConfig, path, overrides, kind=KIND)


def _entropy(logits: np.ndarray) -> float:
    finite = np.isfinite(logits)
    x = logits[finite] - logits[finite].max()
    p = np.exp(x) / np.exp(x).sum()
    return max(0.0, float(-(p * np.log(p)).sum()))


def run(cfg: ShowcaseConfig, *, relative_to: str | None = None, log: Callable[[str], Any] = print) -> list[dict]:
    """Applies every sampler to the distribution after ``cfg.context``; logs a report, returns its rows."""
    import jax
    import jax.numpy as jnp

    from jaxsample import _corpus, compile_cache
    from jaxsample.evaluation.configs import load_sampler

    vocab = _corpus.vocabulary()
    index = {w: i for i, w in enumerate(vocab)}
    words = cfg.context.lower().split()
    unknown = [w for w in words if w not in index]
    if unknown:
        raise ValueError(f"context: {unknown[0]!r} is not a word of the corpus (pydoc_data.topics)")
    logits = jnp.asarray(_corpus.next_word_logits(words[-1]))
    history = jnp.asarray([[index[w] for w in words]], jnp.int32)
    n = cfg.samples
    log(f"next word after {cfg.context!r}: V = {len(vocab):,} words, entropy {_entropy(np.asarray(logits)):.2f} nats; "
        f"most likely: {_top(np.asarray(logits), vocab, cfg.top)}")
    rows, compiled = [], {}
    for name in cfg.samplers:
        try:
            preset = load_sampler(name, relative_to=relative_to).build()
        except (ValueError, FileNotFoundError) as err:
            raise type(err)(f"samplers: {name}: {err}") from None
        sampler = preset.sampler
        params = preset.params((n,), seed=np.arange(n, dtype=np.int32))
        whole = sampler.history_size() == -1  # a stage reads the whole history: the context is all of it
        state = sampler.init(params, vocab_size=len(vocab), prompt=jnp.repeat(history, n, axis=0),
                             history_size=history.shape[1] if whole else None)
        x = jnp.broadcast_to(logits, (n, len(vocab)))
        key = (sampler, jax.tree.structure((state, params)))
        if key not in compiled:  # presets sharing a chain structure share its programs
            with compile_cache.notice(f"the {name} chain ({len(sampler.stages)} stages)", log):
                processed_shape = jax.eval_shape(sampler.process, x, state, params)
                compiled[key] = (jax.jit(sampler.process).lower(x, state, params).compile(),
                                 jax.jit(sampler.select).lower(*processed_shape, params).compile())
        process, select = compiled[key]
        processed, state2 = process(x, state, params)
        tokens, _ = select(processed, state2, params)
        x = np.asarray(processed[0])
        row = {"sampler": name, "kept": int(np.isfinite(x).sum()), "entropy": _entropy(x),
               "top": _top(x, vocab, cfg.top), "samples": [vocab[int(t)] for t in np.asarray(tokens)]}
        rows.append(row)
        log(f"{name:<18} kept {row['kept']:>5,}  entropy {row['entropy']:5.2f}  top: {row['top']}")
        log(f"{'':<18} samples: {' '.join(row['samples'])}")
    return rows


def _top(x: np.ndarray, vocab, k: int) -> str:
    finite = np.isfinite(x)
    p = np.where(finite, np.exp(x - x[finite].max()), 0.0)
    p = p / p.sum()
    best = np.argsort(-p, kind="stable")[:k]
    return ", ".join(f"{vocab[i]} {p[i]:.2f}" for i in best if p[i] > 0)
