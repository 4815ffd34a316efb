"""Dict batches of a set's fields: each field stays with its image through shuffles, worker
processes, both backends, DDP partitions, resume, mixtures and a bucket; a real tokenizer
runs in the reader workers."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
import torch

import fastdata
from fastdata.converters.convert import convert
from tests.helpers import backend_of, caption_of, captioned_folder, s3_server

FIELDS = ["image", "label", "caption", "emb"]


@pytest.fixture(scope="module")
def fields_set(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fieldset")
    src, labels = captioned_folder(tmp, per_class=6)        # 18 samples
    out = {}
    for c in ("hdf5", "lmdb"):
        out[c] = str(tmp / c)
        convert(src, out[c], container=c, sizes=[16], labels=labels, shard_size=5,
                progress=False)
    return out


def _loader(path, **kw):
    args = dict(batch_size=4, size=16, dtype=torch.uint8, augment=False, device="cpu",
                fields=FIELDS)
    return fastdata.Loader(path, **{**args, **kw})


def _ids(ds) -> dict:
    raw = ds.read_batch(range(len(ds)), size=16)
    return {hashlib.md5(raw[i].tobytes()).hexdigest(): i for i in range(len(ds))}


def _checked(loader, ids) -> list[list[int]]:
    """Each batch's sample indices, found from its images; its fields checked against the
    set's values of those samples."""
    ds, out = loader.dataset, []
    for batch in loader:
        assert list(batch) == FIELDS
        nhwc = batch["image"].permute(0, 2, 3, 1).contiguous().numpy()
        idx = [ids[hashlib.md5(x.tobytes()).hexdigest()] for x in nhwc]
        assert batch["caption"] == [caption_of(i) for i in idx]
        assert batch["emb"].dtype == torch.float32 and batch["emb"][:, 0].tolist() == idx
        assert batch["label"].tolist() == ds.labels_of(idx).tolist()
        out.append(idx)
    return out


@pytest.mark.parametrize("backend, workers", [("torch", "thread"), ("torch", "process"),
                                              ("dali", "thread")])
@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
def test_fields_stay_with_their_images(fields_set, backend, workers, container):
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="needs DALI")
    path = fields_set[container]
    ids = _ids(fastdata.open(path))
    loader = _loader(path, backend=backend_of(backend, workers), seed=5)
    order = _checked(loader, ids)
    assert len(order) == 4 and len({i for b in order for i in b}) == 16      # shuffled, full
    assert order != sorted(order)
    loader.close()


def test_ddp_partitions_and_a_resumed_pass_keep_the_fields(fields_set):
    path = fields_set["hdf5"]
    ids = _ids(fastdata.open(path))
    parts = [_checked(_loader(path, train=False, rank=r, world_size=2), ids) for r in (0, 1)]
    assert sorted(i for p in parts for b in p for i in b) == list(range(18))
    whole = _checked(_loader(path, seed=3), ids)
    first = _loader(path, seed=3)
    it = iter(first)
    next(it)
    state = first.state_dict()
    again = _loader(path, seed=3, backend=backend_of("torch", "process"))
    again.load_state_dict(state)
    assert _checked(again, ids) == whole[1:]


def test_a_mixture_of_sets_with_the_same_fields_and_not_others(fields_set, tmp_path):
    mixed = _loader([fields_set["hdf5"], fields_set["lmdb"]], train=False, with_source=True,
                    fields=["image", "caption"])
    batches = list(mixed)
    assert sum(len(b["caption"]) for b in batches) == 36
    assert all(set(b) == {"image", "caption", "source"} for b in batches)
    assert [c for b in batches for c in b["caption"]] == [caption_of(k) for k in range(18)] * 2
    plain = tmp_path / "plain"
    convert(os.path.join(os.path.dirname(fields_set["hdf5"]), "src"), str(plain), sizes=[16],
            progress=False)
    with pytest.raises(ValueError, match="other fields.*caption \\(text\\), emb \\(array\\).*"
                                         "no fields"):
        fastdata.Mixture([fields_set["hdf5"], str(plain)])


@pytest.mark.parametrize("backend, workers", [("torch", "thread"), ("torch", "process"),
                                              ("dali", "thread")])
def test_a_tokenizer_runs_in_the_reader_workers(fields_set, backend, workers):
    tokenizers = pytest.importorskip("tokenizers")
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="needs DALI")
    from tokenizers import models, pre_tokenizers, trainers

    from fastdata.transforms import Tokenize

    tok = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([caption_of(k) for k in range(18)],
                            trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]",
                                                                                "[PAD]"]))
    fn = Tokenize(tok, length=32, pad_id=1, mask=True)
    tok.enable_padding(pad_id=1, pad_token="[PAD]", length=32)      # the ids to expect
    tok.enable_truncation(32)
    loader = _loader(fields_set["hdf5"], backend=backend_of(backend, workers), seed=1,
                     field_transforms={"caption": fn})
    ids = _ids(loader.dataset)
    for batch in loader:
        nhwc = batch["image"].permute(0, 2, 3, 1).contiguous().numpy()
        want = tok.encode_batch([caption_of(ids[hashlib.md5(x.tobytes()).hexdigest()])
                                 for x in nhwc])
        got = batch["caption"]
        assert torch.equal(got["input_ids"], torch.tensor([e.ids for e in want]))
        assert torch.equal(got["attention_mask"], torch.tensor([e.attention_mask for e in want]))
        assert got["input_ids"].shape == (4, 32)
    loader.close()


def test_fields_of_a_set_in_a_bucket(fields_set, tmp_path):
    pytest.importorskip("obstore", reason="obstore not installed")
    local = fields_set["lmdb"]
    with s3_server("fastdata-fields") as client:
        for f in os.listdir(local):
            client.upload_file(os.path.join(local, f), "fastdata-fields", f"s/{f}")
        remote = fastdata.open("s3://fastdata-fields/s", cache_dir=tmp_path)
        a = list(_loader(remote, seed=2))
        b = list(_loader(local, seed=2))
    for x, y in zip(a, b):
        assert torch.equal(x["image"], y["image"]) and x["caption"] == y["caption"]
        assert torch.equal(x["emb"], y["emb"])


@pytest.mark.parametrize("kw, error, match", [
    (dict(fields=["image", "caption", "title"]), ValueError,
     "no field 'title'; its fields are image, label, caption, emb"),
    (dict(fields=["caption"]), ValueError, "\"image\" among them"),
    (dict(fields="caption"), TypeError, "not a list of field names"),
    (dict(fields=["image"], field_transforms={"caption": len}), ValueError,
     "not one of the fields asked for"),
    (dict(field_transforms={"caption": len}), ValueError, "give fields=\\[...\\] too"),
    (dict(fields=["image", "caption"], field_transforms={"caption": 3}), TypeError,
     "must be callable"),
])
def test_bad_fields_are_refused_naming_the_valid_ones(fields_set, kw, error, match):
    with pytest.raises(error, match=match):
        fastdata.Loader(fields_set["hdf5"], batch_size=4, device="cpu", **kw)


def test_a_field_transform_for_worker_processes_must_be_picklable(fields_set):
    with pytest.raises(ValueError, match="field_transforms\\['caption'\\].*cannot be sent"):
        _loader(fields_set["hdf5"], backend=backend_of("torch", "process"),
                field_transforms={"caption": lambda t: t})


def test_a_float_batch_and_its_fields_on_the_augmented_path(fields_set):
    """Cropped, flipped and normalised images: the fields are unchanged by it."""
    loader = fastdata.Loader(fields_set["hdf5"], batch_size=6, size=16, crop=12,
                             device="cpu", fields=["image", "emb"], seed=4)
    order = np.asarray(loader.order.batches()[0])
    batch = next(iter(loader))
    assert batch["image"].shape == (6, 3, 12, 12) and batch["image"].dtype == torch.float32
    assert batch["emb"][:, 0].tolist() == order.tolist()
