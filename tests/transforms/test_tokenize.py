"""``Tokenize``: the ids a real BPE tokenizer (trained here on its own texts) gives with its own
padding and truncation, for unicode, empty and long texts, either padding side, special
tokens and the attention mask; the user's tokenizer left as it was; bad arguments named."""
from __future__ import annotations

import pickle

import pytest
import torch

from fastdata.transforms import Tokenize

tokenizers = pytest.importorskip("tokenizers")

TEXTS = ["a dog sits on the red table", "", "ünïcødé ✓ 猫 sits", "a cat " * 60,
         "two people playing ball near the beach"]


@pytest.fixture
def tok():
    from tokenizers import models, pre_tokenizers, trainers

    t = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.train_from_iterator(TEXTS * 3, trainers.BpeTrainer(
        vocab_size=120, special_tokens=["[UNK]", "[PAD]", "[CLS]", "[SEP]"]))
    return t


def _padded(tok, length, **padding):
    """What the tokenizer itself gives, padded and truncated to ``length``."""
    ref = tokenizers.Tokenizer.from_str(tok.to_str())
    ref.enable_padding(length=length, **padding)
    ref.enable_truncation(length)
    return ref.encode_batch(TEXTS)


def test_the_ids_are_those_of_the_tokenizers_own_padding(tok):
    want = _padded(tok, 16, pad_id=1, pad_token="[PAD]")
    ids = Tokenize(tok, length=16, pad_id=1)(TEXTS)
    assert ids.dtype == torch.int64 and ids.shape == (5, 16)
    assert ids.tolist() == [e.ids for e in want]
    assert any(len(e.ids) > 16 for e in tok.encode_batch(TEXTS))       # one was cut
    assert Tokenize(tok, length=16, pad_id=1, dtype=torch.int32)(TEXTS).dtype == torch.int32
    assert tok.padding is None and tok.truncation is None               # left as it was


def test_special_tokens_left_padding_and_the_mask_follow_the_tokenizer(tok):
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.enable_padding(direction="left", pad_id=1, pad_token="[PAD]")
    settings = tok.padding
    want = _padded(tok, 12, direction="left", pad_id=1, pad_token="[PAD]")
    fn = Tokenize(tok, length=12, mask=True)
    out = pickle.loads(pickle.dumps(fn))(TEXTS)           # as worker processes get it
    assert list(out) == ["input_ids", "attention_mask"]
    assert out["input_ids"].tolist() == [e.ids for e in want]
    assert out["attention_mask"].tolist() == [e.attention_mask for e in want]
    assert out["input_ids"][3, -1] == 3                 # the long text keeps its [SEP]
    assert tok.padding == settings


def test_a_hugging_face_tokenizer_is_read_through_its_backend(tok):
    class Wrapped:      # what transformers' fast tokenizers expose
        backend_tokenizer = tok

    assert torch.equal(Tokenize(Wrapped(), length=8)(TEXTS), Tokenize(tok, length=8)(TEXTS))


@pytest.mark.parametrize("kw, error, match", [
    ({"tokenizer": "bert-base-uncased"}, TypeError, "tokenizers.Tokenizer .* not str"),
    ({"length": 0}, ValueError, "length=0 is not valid; use an integer >= 1"),
    ({"pad_id": -1}, ValueError, "pad_id=-1 is not valid"),
    ({"mask": "yes"}, ValueError, "mask='yes' is not valid; use True or False"),
    ({"dtype": torch.float32}, ValueError, "torch.float32 is not valid; use torch.int64"),
])
def test_bad_arguments_are_named(tok, kw, error, match):
    with pytest.raises(error, match=match):
        Tokenize(**{"tokenizer": tok, "length": 8, **kw})


def test_refused_a_pad_id_outside_the_vocabulary_no_room_for_text_and_one_string(tok):
    from tokenizers import processors

    n = tok.get_vocab_size()
    with pytest.raises(ValueError, match=f"pad_id={n} is not valid; use an integer in 0..{n - 1}"):
        Tokenize(tok, length=8, pad_id=n)
    fn = Tokenize(tok, length=8)
    with pytest.raises(TypeError, match="batch's list of str"):
        fn("a dog")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    with pytest.raises(ValueError, match="length=2 leaves no room .* 2 special tokens"):
        Tokenize(tok, length=2)
