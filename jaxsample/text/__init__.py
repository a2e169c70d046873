"""The text layer: tokenizers in, strings out (see ``docs/text.md``).

* :func:`as_tokenizer` / :class:`TextTokenizer`: one checked interface over ``tokenizers``,
  ``transformers`` fast tokenizers and SentencePiece models;
* :func:`generate_text` / :func:`stream_text`: any decoding strategy with prompts as strings, stop
  strings matched on the device, vLLM's ``include_stop_str_in_output``, per-request
  ``max_tokens`` / ``min_tokens``;
* :class:`IncrementalText`: streaming detokenization that never splits a UTF-8 character;
* :func:`score_text`: teacher-forced log-probs of given continuations (perplexity, reranking).
"""

from jaxsample.text.detokenize import IncrementalText
from jaxsample.text.generate import TextChunk, TextOutput, generate_text, stream_text
from jaxsample.text.score import TextScore, score_text
from jaxsample.text.tokenizer import TextTokenizer, as_tokenizer

__all__ = sorted([
    "IncrementalText",
    "TextChunk",
    "TextOutput",
    "TextScore",
    "TextTokenizer",
    "as_tokenizer",
    "generate_text",
    "score_text",
    "stream_text",
])
