"""SentencePiece ``.model`` tokenizers for the infilling pipeline (the interface of
:class:`wakong.tokenizer.TextTokenizer`).

The model must hold a piece for every BART special token (``<s> <pad> </s> <unk> <mask>`` by default,
or the names in ``tokenizer.special``); a model without them is refused, naming what is missing and
how to train one that has them (``--user_defined_symbols=<mask>``, ``--pad_id=...``). Record text is
encoded by a copy of the model in which those pieces are control symbols, so a literal ``<mask>`` in
the data becomes ordinary pieces and can never inject a mask (SentencePiece otherwise matches
user-defined symbols anywhere in the text).

Records are encoded whole (SentencePiece's unigram lattice spans the text, and ties between equal
segmentations of a word can depend on what precedes it, so words are not encoded apart). Grouping by
word: a piece belongs to the word holding its last byte; a piece that is only the space marker (``▁``
standing alone) belongs to the word after it. For models that split at whitespace and add a dummy
prefix (the defaults) that is: a word starts at every piece starting with ``▁``, read off the ids
without offsets. Needs ``sentencepiece`` (``pip install 'jaxsample[text]'``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import os
from typing import Iterable, Sequence

import numpy as np

from wakong import records
from wakong.records import _starts
from wakong.tokenizer import SpecialTokens, TokenizerError


_CONTROL = 3  # sentencepiece_model.proto: ModelProto.SentencePiece.Type.CONTROL


@functools.cache
def _model_proto_class():
    """The fields of SentencePiece's ``ModelProto`` read or written here, as a protobuf message class.

    Built from a descriptor rather than ``sentencepiece.sentencepiece_model_pb2``: that generated module
    refuses protobuf runtimes older than the protobuf it was generated with (sentencepiece 0.2.3 needs
    protobuf 7, Apache Beam caps protobuf below 7). Fields not declared here survive parsing and
    serialising as unknown fields (written after the declared ones: same model, other byte order).
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="jaxsample_sentencepiece_model.proto", package="jaxsample_spm")

    def message(into, name, *fields):
        """Adds message ``name`` with ``(field name, number, type, options)`` fields (proto2, optional)."""
        m = into.add(name=name)
        for field_name, number, kind, options in fields:
            m.field.add(name=field_name, number=number, type=kind, **{"label": F.LABEL_OPTIONAL, **options})
        return m

    def of(name):
        return {"type_name": f".jaxsample_spm.{name}"}

    model = message(
        f.message_type, "ModelProto",
        ("pieces", 1, F.TYPE_MESSAGE, {**of("ModelProto.SentencePiece"), "label": F.LABEL_REPEATED}),
        ("trainer_spec", 2, F.TYPE_MESSAGE, of("TrainerSpec")),
        ("normalizer_spec", 3, F.TYPE_MESSAGE, of("NormalizerSpec")),
    )
    message(model.nested_type, "SentencePiece",
            ("piece", 1, F.TYPE_STRING, {}), ("type", 3, F.TYPE_INT32, {"default_value": "1"}))
    message(f.message_type, "TrainerSpec", ("split_by_whitespace", 22, F.TYPE_BOOL, {"default_value": "true"}),
            ("treat_whitespace_as_suffix", 24, F.TYPE_BOOL, {"default_value": "false"}))
    message(f.message_type, "NormalizerSpec", ("add_dummy_prefix", 3, F.TYPE_BOOL, {"default_value": "true"}))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("jaxsample_spm.ModelProto"))


class SentencePieceTokenizer:
    """A SentencePiece model plus BART special ids, sha256 and word-grouped encoding. Picklable."""

    #: Name of the tokenizer file in a dataset directory.
    file_name = "tokenizer.model"

    def __init__(self, model: bytes, specials: SpecialTokens = SpecialTokens(), *, origin: str = "<memory>"):
        try:
            import sentencepiece
        except ImportError:
            raise ImportError("SentencePiece tokenizers need sentencepiece: pip install 'jaxsample[text]'") from None
        proto = _model_proto_class()()
        try:
            proto.ParseFromString(model)
            self.sp = sentencepiece.SentencePieceProcessor(model_proto=model)
        except Exception as err:  # protobuf's DecodeError, SentencePiece's RuntimeError
            raise TokenizerError(f"{origin} is not a valid SentencePiece model: {err}") from None
        self.model, self.specials, self.origin = model, specials, origin
        self.training: dict | None = None
        self.sha256 = hashlib.sha256(model).hexdigest()
        self.vocab_size = self.sp.get_piece_size()
        ids = {}
        for role, piece in dataclasses.asdict(specials).items():
            ids[role] = self.sp.piece_to_id(piece)
            if self.sp.id_to_piece(ids[role]) != piece:  # piece_to_id answers unk for unknown pieces
                raise TokenizerError(
                    f"{origin} has no piece {piece!r} (needed as {role}); train the model with it (e.g. "
                    f"--user_defined_symbols=<mask> --pad_id=1 --pad_piece=<pad>) or set tokenizer.special.{role}"
                )
        self.bos_id, self.pad_id, self.eos_id = ids["bos"], ids["pad"], ids["eos"]
        self.unk_id, self.mask_id, self.decoder_start_id = ids["unk"], ids["mask"], ids["decoder_start"]
        special = set(ids.values()) | {
            i for i in range(self.vocab_size) if self.sp.is_control(i) or self.sp.is_unknown(i) or self.sp.is_unused(i)
        }
        #: Ids random-token replacement draws from (every id that is not special).
        self.random_ids = np.setdiff1d(np.arange(self.vocab_size), np.fromiter(special, int)).astype(np.int32)
        for i in set(ids.values()) - {self.unk_id}:
            proto.pieces[i].type = _CONTROL
        self._body = sentencepiece.SentencePieceProcessor(model_proto=proto.SerializeToString())
        normalizer, trainer = proto.normalizer_spec, proto.trainer_spec
        self._word_start = None  # pieces that start a word, when the model marks every word that way
        if normalizer.add_dummy_prefix and trainer.split_by_whitespace and not trainer.treat_whitespace_as_suffix:
            self._word_start = np.array([p.piece.startswith("\u2581") for p in proto.pieces])

    def __reduce__(self):
        return (SentencePieceTokenizer, (self.model, self.specials), {"origin": self.origin, "training": None})

    def __setstate__(self, state):
        self.origin, self.training = state["origin"], state.get("training")

    def encode_records(self, records: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`wakong.tokenizer.TextTokenizer.encode_records`."""
        texts = [" ".join(words) for words in records]
        encoded = self._body.encode(texts) if texts else []
        sizes = np.fromiter(map(len, encoded), np.int64, len(encoded))
        ids = np.fromiter(itertools.chain.from_iterable(encoded), np.int32, int(sizes.sum()))
        n_words = np.fromiter(map(len, records), np.int64, len(records))
        if self._word_start is None or not len(ids):
            good = np.zeros(len(records), bool)
        else:
            starts = self._word_start[ids]
            counts = np.bincount(np.repeat(np.arange(len(records)), sizes), starts, minlength=len(records))
            good = counts == n_words  # each word begins with a marked piece (else a word vanished)
            if good.all():
                return ids, np.diff(np.append(np.flatnonzero(starts), len(ids))).astype(np.int32)
        lengths, at = [np.zeros(0, np.int32)], _starts(sizes)
        for k, (words, text) in enumerate(zip(records, texts)):
            if good[k]:
                marks = np.flatnonzero(starts[at[k] : at[k] + sizes[k]])
                lengths.append(np.diff(np.append(marks, sizes[k])).astype(np.int32))
            else:
                lengths.append(self._grouped(words, text))
        return ids, np.concatenate(lengths)

    def _grouped(self, words: Sequence[str], text: str) -> np.ndarray:
        """Pieces per word of one record, from the pieces' byte offsets."""
        pieces = self._body.encode(text, return_type="proto").pieces
        ends = np.cumsum([len(w.encode()) + 1 for w in words])  # the byte after each word (its space)
        keys = [p.end if not p.surface.strip() else p.end - 1 for p in pieces]
        return np.bincount(np.searchsorted(ends, keys, side="right"), minlength=len(words)).astype(np.int32)

    def encode_words(self, words: Sequence[str]) -> list[tuple[int, ...]]:
        """Piece ids of ``' '.join(words)`` grouped by word (a word without pieces gives ``()``)."""
        from wakong.tokenizer import split_groups

        return split_groups(*self.encode_records([list(words)])) if words else []

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` with special pieces shown."""
        out, run = [], []
        specials = {self.bos_id, self.pad_id, self.eos_id, self.mask_id}
        for i in map(int, ids):
            if i in specials:
                out += [self.sp.decode(run), self.sp.id_to_piece(i)]
                run = []
            else:
                run.append(i)
        return "".join(out + [self.sp.decode(run)])

    def save(self, path: str | os.PathLike) -> None:
        """Writes the model atomically (the sha256 is of exactly these bytes)."""
        tmp = os.fspath(path) + records.temp_suffix()
        with open(tmp, "wb") as f:
            f.write(self.model)
        os.replace(tmp, path)
