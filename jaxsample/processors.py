"""Moved: token-id masks live in :mod:`jaxsample.token_ids`, ``remove_inf_nan`` and ``log_softmax`` in
:mod:`jaxsample.normalization` (this alias stays)."""

from jaxsample.normalization import log_softmax, remove_inf_nan
from jaxsample.token_ids import token_mask

__all__ = ["log_softmax", "remove_inf_nan", "token_mask"]
