"""Batch layouts that trainers consume: HF BART, seqio / t5x and MaxText feature names, packed or not.

Every layout is computed from one *canonical* row form (numpy or jax arrays, ``[B, ...]``):
``source``/``target`` token ids ``[B, S]``/``[B, T]`` (with BOS/EOS; the target is the labels),
``*_segments`` (``0`` on padding, ``1, 2, ...`` per packed example) and ``*_positions`` (restarting at
0 in every example). An unpacked row is one segment.

================ ============================================================================
``hf``           ``input_ids``, ``attention_mask``, ``decoder_input_ids``, ``decoder_attention_mask``,
                 ``labels``, ``loss_mask`` (``pad_id`` padding; what :mod:`jaxsample.models.train`
                 and HF Flax BART read); packed adds ``segment_ids``, ``position_ids``,
                 ``decoder_segment_ids``, ``decoder_position_ids`` (jaxsample's BART honours them; HF
                 BART's 2-D ``attention_mask`` cannot express packing)
``seqio``        seqio task features: ``inputs``, ``targets``; packed adds ``inputs_segment_ids``,
                 ``inputs_positions``, ``targets_segment_ids``, ``targets_positions``
                 (``seqio.utils.trim_and_pack_dataset``'s names; 0 padding)
``t5x``          ``EncDecFeatureConverter``'s model features: ``encoder_input_tokens``,
                 ``decoder_target_tokens``, ``decoder_input_tokens``, ``decoder_loss_weights``; packed
                 adds ``encoder_segment_ids``, ``decoder_segment_ids``, ``encoder_positions``,
                 ``decoder_positions`` (0 padding)
``maxtext``      MaxText's decoder-only names: ``inputs``, ``inputs_segmentation``,
                 ``inputs_position``, ``targets``, ``targets_segmentation``, ``targets_position``,
                 rows of ``S + T`` tokens holding each example's source then its target (a prefix
                 LM, as MaxText's SFT rows hold prompt then completion); ``targets`` is the next
                 token and ``targets_segmentation`` is non-zero exactly where that token is one of
                 the example's labels, so the loss covers the same tokens as BART's ``loss_mask``
================ ============================================================================

Decoder inputs are the labels shifted right *within each segment* behind ``decoder_start_id``. The
attention an encoder-decoder needs follows from the segment ids (:func:`attention_masks`): encoder
tokens see their own example, decoder tokens their own example's earlier tokens and its source.

Caveat: t5x derives padding from token id 0 when it gets no segment ids, and BART tokenizers use 0
for ``<s>``; feed t5x packed batches (``pack=True``) or a tokenizer whose id 0 is padding.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

FORMATS = ("hf", "seqio", "t5x", "maxtext")


def _xp(x):
    """numpy for numpy inputs, jax.numpy otherwise (so layouts work on the host and in jit)."""
    if isinstance(x, np.ndarray):
        return np
    import jax.numpy as jnp

    return jnp


def check_format(name: str) -> str:
    if name not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}; got {name!r}")
    return name


def canonical_from_hf(features: Mapping[str, Any]) -> dict:
    """The canonical form of unpacked HF features (``input_ids``, ``attention_mask``, ``labels``,
    ``loss_mask``): one segment per real row."""
    xp = _xp(features["input_ids"])
    out = {}
    for side, ids, mask in (("source", "input_ids", "attention_mask"), ("target", "labels", "loss_mask")):
        real = xp.asarray(features[mask]).astype(bool)
        out[side] = xp.asarray(features[ids]).astype(np.int32)
        out[f"{side}_segments"] = real.astype(np.int32)
        out[f"{side}_positions"] = xp.where(real, xp.cumsum(real, axis=1) - 1, 0).astype(np.int32)
    return out


def layout(rows: Mapping[str, Any], fmt: str, *, pad_id: int, decoder_start_id: int, packed: bool) -> dict:
    """The ``fmt`` features of canonical ``rows`` (see the module docstring).

    >>> rows = canonical_from_hf({"input_ids": np.array([[0, 4, 2, 1]]), "attention_mask": np.array([[1, 1, 1, 0]]),
    ...                           "labels": np.array([[0, 7, 2]]), "loss_mask": np.array([[True, True, True]])})
    >>> t5x = layout(rows, "t5x", pad_id=1, decoder_start_id=2, packed=False)
    >>> t5x["encoder_input_tokens"].tolist(), t5x["decoder_input_tokens"].tolist(), t5x["decoder_loss_weights"].tolist()
    ([[0, 4, 2, 0]], [[2, 0, 7]], [[1, 1, 1]])
    """
    check_format(fmt)
    xp = _xp(rows["source"])
    src, tgt = rows["source"], rows["target"]
    s_seg, t_seg = rows["source_segments"], rows["target_segments"]
    s_pos, t_pos = rows["source_positions"], rows["target_positions"]
    if fmt == "maxtext":
        return _maxtext(xp, rows)
    pad = pad_id if fmt == "hf" else 0
    shifted = xp.concatenate([xp.zeros_like(tgt[:, :1]), tgt[:, :-1]], axis=1)
    decoder = xp.where(t_seg > 0, xp.where(t_pos == 0, decoder_start_id, shifted), pad).astype(np.int32)
    src = xp.where(s_seg > 0, src, pad).astype(np.int32)
    tgt = xp.where(t_seg > 0, tgt, pad).astype(np.int32)
    if fmt == "hf":
        out = {"input_ids": src, "attention_mask": (s_seg > 0).astype(np.int32), "decoder_input_ids": decoder,
               "decoder_attention_mask": (t_seg > 0).astype(np.int32), "labels": tgt, "loss_mask": t_seg > 0}
        extra = {"segment_ids": s_seg, "position_ids": s_pos, "decoder_segment_ids": t_seg,
                 "decoder_position_ids": t_pos}
    elif fmt == "seqio":
        out = {"inputs": src, "targets": tgt}
        extra = {"inputs_segment_ids": s_seg, "inputs_positions": s_pos, "targets_segment_ids": t_seg,
                 "targets_positions": t_pos}
    else:
        out = {"encoder_input_tokens": src, "decoder_target_tokens": tgt, "decoder_input_tokens": decoder,
               "decoder_loss_weights": (t_seg > 0).astype(np.int32)}
        extra = {"encoder_segment_ids": s_seg, "decoder_segment_ids": t_seg, "encoder_positions": s_pos,
                 "decoder_positions": t_pos}
    if packed:
        out.update({k: xp.asarray(v).astype(np.int32) for k, v in extra.items()})
    return out


def _maxtext(xp, rows: Mapping[str, Any]) -> dict:
    """Decoder-only rows: every example's source then its target, examples in segment order."""
    src, tgt = rows["source"], rows["target"]
    s_seg, t_seg = rows["source_segments"], rows["target_segments"]
    b, s, t = src.shape[0], src.shape[1], tgt.shape[1]
    width = s + t
    # Each example starts after every token of the examples before it (segments are in order).
    n_seg = min(s, t) + 1
    s_len, t_len = _count(xp, s_seg, n_seg), _count(xp, t_seg, n_seg)
    before = xp.cumsum(s_len + t_len, axis=1) - (s_len + t_len)  # [B, segments]
    s_at = xp.where(s_seg > 0, xp.take_along_axis(before, s_seg, axis=1) + rows["source_positions"], width)
    t_at = xp.where(t_seg > 0, xp.take_along_axis(before + s_len, t_seg, axis=1) + rows["target_positions"], width)
    at = xp.concatenate([s_at, t_at], axis=1)
    tokens = xp.concatenate([src, tgt], axis=1).astype(np.int32)
    segment = xp.concatenate([s_seg, t_seg], axis=1).astype(np.int32)
    position = xp.concatenate([rows["source_positions"],
                               xp.take_along_axis(s_len, t_seg, axis=1) + rows["target_positions"]], axis=1)
    is_target = xp.concatenate([xp.zeros_like(s_seg, dtype=bool), t_seg > 0], axis=1)
    fields = {"inputs": tokens, "inputs_segmentation": segment, "inputs_position": position.astype(np.int32),
              "label": is_target}
    out = {name: _place(xp, at, value, b, width) for name, value in fields.items()}
    seg = out["inputs_segmentation"]
    nxt = lambda x: xp.concatenate([x[:, 1:], xp.zeros_like(x[:, :1])], axis=1)  # noqa: E731
    same = (nxt(seg) == seg) & (seg > 0)
    scored = same & nxt(out.pop("label"))
    return {
        "inputs": out["inputs"],
        "inputs_segmentation": seg,
        "inputs_position": out["inputs_position"],
        "targets": xp.where(same, nxt(out["inputs"]), 0).astype(np.int32),
        "targets_segmentation": xp.where(scored, seg, 0).astype(np.int32),
        "targets_position": out["inputs_position"],
    }


def _count(xp, segments, n: int):
    """``int32[B, n]``: tokens of each segment id (0: padding) per row."""
    rows = xp.arange(segments.shape[0])[:, None]
    if xp is np:
        out = np.zeros((segments.shape[0], n), np.int32)
        np.add.at(out, (np.broadcast_to(rows, segments.shape), segments), 1)
        return out
    return xp.zeros((segments.shape[0], n), np.int32).at[rows, segments].add(1, mode="drop")


def _place(xp, at, values, b: int, width: int):
    """``out[b, at[b, i]] = values[b, i]`` into zeros ``[B, width]`` (``at == width``: dropped)."""
    rows = xp.arange(b)[:, None]
    if xp is np:
        out = np.zeros((b, width + 1), values.dtype)
        out[np.broadcast_to(rows, at.shape), at] = values
        return out[:, :width]
    return xp.zeros((b, width), values.dtype).at[rows, at].set(values, mode="drop")


def attention_masks(segments_source, segments_target, positions_target) -> dict:
    """The attention packed (or padded) rows imply, ``bool``: ``encoder [B, S, S]`` (same example),
    ``decoder [B, T, T]`` (same example, causal) and ``cross [B, T, S]`` (the example's source)."""
    s, t = segments_source, segments_target
    same = lambda a, c: (a[:, :, None] == c[:, None, :]) & (a[:, :, None] > 0)  # noqa: E731
    causal = positions_target[:, None, :] <= positions_target[:, :, None]
    return {"encoder": same(s, s), "decoder": same(t, t) & causal, "cross": same(t, s)}


__all__ = ["FORMATS", "attention_masks", "canonical_from_hf", "check_format", "layout"]
