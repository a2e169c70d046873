"""wakong: the Wakong span-masking algorithm, bit-exact with ``wakong==1.1.1``, plus a fixed-shape JAX form.

Drop-in API of the reference package: :func:`generate_mask_scheme`, :func:`apply_mask_scheme`,
:class:`Wakong`, :func:`pretty_print_mask_scheme` (pure Python). The JAX form: :func:`span_mask`,
imported on first use so that the reference API (and data-loading workers) never import JAX.
"""

from wakong._reference import MaskScheme, Wakong, apply_mask_scheme, generate_mask_scheme, pretty_print_mask_scheme

__version__ = "1.1.1"

__all__ = [
    "MaskScheme",
    "Wakong",
    "apply_mask_scheme",
    "generate_mask_scheme",
    "pretty_print_mask_scheme",
    "span_mask",
]


def __getattr__(name):
    if name == "span_mask":
        from wakong._span_mask import span_mask

        return span_mask
    raise AttributeError(f"module 'wakong' has no attribute {name!r}")
