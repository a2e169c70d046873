"""wakong: the Wakong span-masking algorithm, bit-exact with ``wakong==1.1.1``, plus a fixed-shape JAX form.

Drop-in API of the reference package: :func:`generate_mask_scheme`, :func:`apply_mask_scheme`,
:class:`Wakong`, :func:`pretty_print_mask_scheme`. The JAX form: :func:`span_mask`.
"""

from wakong._reference import MaskScheme, Wakong, apply_mask_scheme, generate_mask_scheme, pretty_print_mask_scheme
from wakong._span_mask import span_mask

__version__ = "1.1.1"

__all__ = sorted([
    "MaskScheme",
    "Wakong",
    "apply_mask_scheme",
    "generate_mask_scheme",
    "pretty_print_mask_scheme",
    "span_mask",
])
