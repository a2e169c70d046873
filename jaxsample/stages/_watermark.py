"""Stages for the text watermarks: HF's greenlist watermark and SynthID-Text."""

from __future__ import annotations

from jaxsample import synthid as _synthid
from jaxsample import watermark as _watermark
from jaxsample.chain import Param, Stage, cached


@cached
def watermark(
    greenlist_ratio: float = 0.25,
    bias: float = 2.0,
    *,
    hashing_key: int = _watermark.DEFAULT_HASHING_KEY,
    seeding_scheme: str = "lefthash",
    context_width: int = 1,
    name: str = "watermark",
) -> Stage:
    """HF ``WatermarkLogitsProcessor`` (:func:`jaxsample.watermark`) over prompt + generated ids.

    ``hashing_key``, ``seeding_scheme`` and ``context_width`` are static (they fix the hash and
    the window). Params: ``greenlist_ratio`` (``gamma`` in ``(0, 1)``), ``watermark_bias`` (``delta``).
    """
    cfg = _watermark.watermark_config(
        greenlist_ratio=greenlist_ratio, bias=bias, hashing_key=hashing_key, seeding_scheme=seeding_scheme,
        context_width=context_width,
    )
    params = (
        Param("greenlist_ratio", cfg.greenlist_ratio, lo=0.0, hi=1.0, lo_open=True, hi_open=True),
        Param("watermark_bias", cfg.bias),
    )

    def update(x, s, p, info):
        out = _watermark.watermark(
            x, info.history, p["greenlist_ratio"], p["watermark_bias"], hashing_key=cfg.hashing_key,
            seeding_scheme=cfg.seeding_scheme, context_width=cfg.context_width,
        )
        return out, s

    return Stage(name, update, params=params, history=cfg.context_width, nan_free=True)


@cached
def synthid_watermark(
    ngram_len: int,
    keys: tuple[int, ...],
    context_history_size: int = 1024,
    sampling_table_seed: int = 0,
    sampling_table_size: int = 2**16,
    skip_first_ngram_calls: bool = False,
    debug_mode: bool = False,
    *,
    name: str = "synthid_watermark",
) -> Stage:
    """HF ``SynthIDTextWatermarkLogitsProcessor`` (:func:`jaxsample.synthid_watermark`).

    Every field is static (HF's config). The context is the last ``ngram_len - 1`` generated tokens;
    the state is the ring of the last ``context_history_size`` context hashes.
    """
    cfg = _synthid.synthid_config(
        ngram_len=ngram_len, keys=tuple(keys), context_history_size=context_history_size,
        sampling_table_seed=sampling_table_seed, sampling_table_size=sampling_table_size,
        skip_first_ngram_calls=skip_first_ngram_calls, debug_mode=debug_mode,
    )

    def update(x, s, p, info):
        return _synthid.synthid_watermark(x, s, info.history, info.position, cfg)

    return Stage(
        name, update, init=lambda info: _synthid.synthid_init(info.batch_shape, cfg), history=cfg.ngram_len - 1,
        nan_free=True,
    )
