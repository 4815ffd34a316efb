"""``Tokenize``: a text field's batch function (``Loader(field_transforms={"caption": ...})``)
that makes a batch's strings a fixed-length tensor of token ids, as CLIP-style text encoders
and Hugging Face models take them."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fastdata.checks import flag, integer

_DTYPES = {torch.int64: np.int64, torch.int32: np.int32}


class Tokenize:
    """A batch of strings tokenised into ``(B, length)`` ids, as the tokenizer's own padding
    and truncation to ``length`` would give them, for less CPU: the tokenizer only tokenises
    (its padding makes a string per padded token) and the ids are padded into one array.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``, or a Hugging Face fast tokenizer (its
            ``backend_tokenizer``). Its settings are copied, not changed: its truncation
            (strategy, direction) to ``length``, keeping the special tokens its
            post-processor adds; its padding's direction and id, where it pads.
        length: the ids' length, special tokens included.
        pad_id: the id that pads a shorter text, one of the vocabulary's (default: the
            tokenizer's padding id, or 0 where it does not pad).
        mask: return ``{"input_ids": ids, "attention_mask": mask}`` (1 for a token, 0 for
            padding), as Hugging Face models take them, instead of the ids alone.
        dtype: ``torch.int64`` (the default) or ``torch.int32``.

    Returns (when called with a batch's list of ``str``):
        The ids, a ``(B, length)`` tensor of ``dtype``, or the dict that ``mask`` gives.

    Raises:
        TypeError: ``tokenizer`` that is not a ``tokenizers`` tokenizer; a call with a single
            ``str`` instead of a batch's list.
        ValueError: ``length``, ``pad_id`` or ``dtype`` not valid (naming the valid values),
            or a ``length`` that leaves no room beside the tokenizer's special tokens.
    """

    def __init__(self, tokenizer: Any, *, length: int, pad_id: int | None = None,
                 mask: bool = False, dtype: torch.dtype = torch.int64):
        tok = getattr(tokenizer, "backend_tokenizer", tokenizer)
        if not all(hasattr(tok, a) for a in ("to_str", "from_str", "encode_batch",
                                             "enable_truncation", "no_padding",
                                             "get_vocab_size")):
            raise TypeError(f"Tokenize takes a tokenizers.Tokenizer or a Hugging Face fast "
                            f"tokenizer, not {type(tokenizer).__name__}")
        self.length = integer("length", length, 1)
        padding = tok.padding or {}
        self.pad_id = integer("pad_id", padding.get("pad_id", 0) if pad_id is None else pad_id,
                              0, tok.get_vocab_size(with_added_tokens=True) - 1)
        self.left = padding.get("direction") == "left"
        self.mask = flag("mask", mask)
        if dtype not in _DTYPES:
            raise ValueError(f"dtype={dtype!r} is not valid; use torch.int64 or torch.int32")
        self.dtype = dtype
        special = tok.num_special_tokens_to_add(False)
        if special >= self.length:
            raise ValueError(f"length={length} leaves no room for text beside the tokenizer's "
                             f"{special} special tokens; use a length above {special}")
        own = type(tok).from_str(tok.to_str())
        own.no_padding()
        cut = tok.truncation or {}
        own.enable_truncation(self.length, strategy=cut.get("strategy", "longest_first"),
                              direction=cut.get("direction", "right"))
        self.tokenizer = own

    def __call__(self, texts):
        """A batch's texts (a list of ``str``) as ids (and their mask, with ``mask``)."""
        if isinstance(texts, str):
            raise TypeError("Tokenize takes a batch's list of str, not one str")
        tok = self.tokenizer
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)   # no offsets: faster
        encodings = encode(list(texts))
        n, length = len(encodings), self.length
        ids = np.full((n, length), self.pad_id, _DTYPES[self.dtype])
        lengths = np.empty(n, np.int64)
        for k, e in enumerate(encodings):
            got = e.ids
            lengths[k] = m = len(got)
            if self.left:
                ids[k, length - m:] = got
            else:
                ids[k, :m] = got
        out = torch.from_numpy(ids)
        if not self.mask:
            return out
        at = np.arange(length)
        kept = at >= length - lengths[:, None] if self.left else at < lengths[:, None]
        return {"input_ids": out, "attention_mask": torch.from_numpy(kept.astype(ids.dtype))}

    def __repr__(self) -> str:
        return (f"Tokenize(length={self.length}, pad_id={self.pad_id}, mask={self.mask}, "
                f"dtype={self.dtype})")
