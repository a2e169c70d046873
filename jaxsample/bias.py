"""Moved: the per-token constraints live in :mod:`jaxsample.constraints` (this alias stays)."""

from jaxsample.constraints import allowed_tokens, ignore_eos, logit_bias, suppress_tokens, suppress_tokens_at_begin

__all__ = ["allowed_tokens", "ignore_eos", "logit_bias", "suppress_tokens", "suppress_tokens_at_begin"]
