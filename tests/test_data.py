"""helpers.data.text: splits, CSV errors, the padding collate function and the length-bucketing sampler."""

from __future__ import annotations

import pickle
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader

from helpers.data import text as data
from helpers.data.corpus import read_csv_corpus
from helpers.data.text import (
    LengthBucketSampler,
    PadCollate,
    TextExamples,
    TokenizedDataset,
    load_text_classification,
    make_dataloader,
    padding_fraction,
    stratified_split,
)


@pytest.fixture(scope="module")
def bundled():
    return load_text_classification("bundled", seed=0, verbose=False)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from helpers.core.hub import offline_bert_path

    return AutoTokenizer.from_pretrained(offline_bert_path())


def test_bundled_corpus_is_the_bbc_news_articles(bundled):
    assert bundled.label_names == ["business", "entertainment", "politics", "sports", "tech"]
    assert sum(bundled.sizes.values()) == 2225 - 98  # exact duplicates dropped
    raw = load_text_classification("bundled", dedupe=False, verbose=False)
    assert sum(raw.sizes.values()) == 2225
    assert bundled.source == "bundled"
    assert all(isinstance(t, str) and t for t in bundled.train.texts[:50])


def test_auto_falls_back_to_bundled_when_hub_disabled(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    splits = load_text_classification(max_examples=100)
    assert splits.source == "bundled"
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "HF_HUB_OFFLINE" in out[0] and "bundled" in out[0]


def test_splits_deterministic_disjoint_and_stratified(bundled):
    again = load_text_classification("bundled", seed=0, verbose=False)
    assert again.train.texts == bundled.train.texts and again.test.labels == bundled.test.labels
    other = load_text_classification("bundled", seed=1, verbose=False)
    assert other.test.texts != bundled.test.texts
    parts = [set(bundled.train.texts), set(bundled.val.texts), set(bundled.test.texts)]
    assert not (parts[0] & parts[1]) and not (parts[0] & parts[2]) and not (parts[1] & parts[2])
    total = Counter(bundled.train.labels + bundled.val.labels + bundled.test.labels)
    n = sum(total.values())
    for split in (bundled.train, bundled.val, bundled.test):
        counts = Counter(split.labels)
        for c, k in total.items():  # each class within one example of its share of the whole
            assert abs(counts[c] - k * len(split) / n) <= 1.5, (c, counts[c], k * len(split) / n)


def test_stratified_split_indices_cover_everything_once():
    labels = [0] * 40 + [1] * 30 + [2] * 30
    tr, va, te = stratified_split(labels, 0.2, 0.1, seed=3)
    assert sorted(tr + va + te) == list(range(100))
    assert (len(tr), len(va), len(te)) == (70, 20, 10)
    assert Counter(labels[i] for i in te) == {0: 4, 1: 3, 2: 3}
    with pytest.raises(ValueError, match="val_frac"):
        stratified_split(labels, 0.6, 0.5)


def test_the_stratified_draw_is_scikit_learns_without_importing_it():
    """helpers.data.text draws its splits as scikit-learn's train_test_split(stratify=...) does, index for
    index and in the same order (the course's recorded results rest on its split), without importing it:
    uneven
    classes, ties among the remainders, both sizes given as fractions or counts, many seeds."""
    import numpy as np

    train_test_split = pytest.importorskip("sklearn.model_selection").train_test_split
    rng = np.random.default_rng()  # new labels every run; the seed is in the message
    for case in range(40):
        n_classes = int(rng.integers(2, 7))
        shares = rng.dirichlet([1] * n_classes)
        # at least 10 rows a class: a test share of 10 % then holds a row of each, which scikit-learn requires
        # (50 rows of 6 classes at 10 % made it refuse the case, not the course's draw)
        y = rng.choice(n_classes, size=int(rng.integers(10 * n_classes, 400)), p=shares)
        y = np.concatenate([y, np.repeat(np.arange(n_classes), 3)])  # every class at least 3 times
        seed, test_frac = int(rng.integers(0, 2**31)), float(rng.choice([0.1, 0.15, 0.2, 0.25, 1 / 3]))
        n_test = int(np.ceil(test_frac * len(y)))
        want = train_test_split(np.arange(len(y)), test_size=test_frac, stratify=y, random_state=seed)
        got = data._stratified_draw(y, len(y) - n_test, n_test, seed)
        assert [g.tolist() for g in got] == [w.tolist() for w in want], (case, seed, test_frac, y.tolist())
        n_train = int(rng.integers(n_classes, len(y) - n_classes))
        want = train_test_split(np.arange(len(y)), train_size=n_train, stratify=y, random_state=seed)
        got = data._stratified_draw(y, n_train, len(y) - n_train, seed)
        assert [g.tolist() for g in got] == [w.tolist() for w in want], (case, seed, n_train, y.tolist())
    with pytest.raises(ValueError, match="at least 2 examples of each class"):
        data._stratified_draw(np.array([0, 0, 0, 1]), 2, 2, 0)


# sha256 of the split articles' texts (train, val, test), drawn with scikit-learn before the course drew
# them itself: (seed, max_examples) -> its first 16 hex digits
SPLIT_DIGESTS = {(0, None): "957a06102ef7fe17", (1, None): "03a773268822aac2", (0, 200): "1bff9820a402a711"}


def test_the_course_split_is_the_one_scikit_learn_drew():
    """The bundled corpus's splits (seed 0 is every lesson's; a --max-examples subset) hold the same articles
    as when scikit-learn drew them: the recorded results rest on them."""
    import hashlib

    for (seed, most), want in SPLIT_DIGESTS.items():
        s = load_text_classification("bundled", seed=seed, max_examples=most, verbose=False)
        h = hashlib.sha256()
        for part in (s.train, s.val, s.test):
            h.update("\x1e".join(part.texts).encode())
            h.update(b"\x1d")
        assert h.hexdigest()[:16] == want, (seed, most)


def test_csv_good_wrong_columns_and_empty(tmp_path):
    good = tmp_path / "good.csv"
    good.write_text("text,label\nhello world,pos\n\"a, b\",neg\nmore,pos\n", encoding="utf-8")
    texts, labels, names = read_csv_corpus(good)
    assert texts == ["hello world", "a, b", "more"] and names == ["neg", "pos"] and labels == [1, 0, 1]
    numeric = tmp_path / "num.csv"
    numeric.write_text("label,text\n10,x\n2,y\n", encoding="utf-8")
    assert read_csv_corpus(numeric)[2] == ["2", "10"]  # integer labels sort as numbers
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("sentence,category\nhi,a\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"needs columns 'text' and 'label'.*sentence.*category"):
        read_csv_corpus(wrong)
    empty = tmp_path / "empty.csv"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="empty"):
        read_csv_corpus(empty)
    header_only = tmp_path / "header.csv"
    header_only.write_text("text,label\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no rows"):
        read_csv_corpus(header_only)
    with pytest.raises(ValueError, match="does not exist"):
        read_csv_corpus(tmp_path / "missing.csv")


def test_csv_path_selects_csv_source(tmp_path):
    f = tmp_path / "mine.csv"
    rows = "".join(f"text number {i},{'ab'[i % 2]}\n" for i in range(40))
    f.write_text("text,label\n" + rows, encoding="utf-8")
    splits = load_text_classification(csv_path=f, verbose=False)
    assert splits.source == "csv" and splits.label_names == ["a", "b"] and sum(splits.sizes.values()) == 40
    with pytest.raises(ValueError, match="source must be one of"):
        load_text_classification("web")


def test_collate_pads_to_longest_and_masks_real_tokens():
    batch = [{"input_ids": [101, 5, 6, 102], "labels": 1}, {"input_ids": [101, 102], "labels": 0},
             {"input_ids": [101, 7, 102], "labels": 2}]
    out = PadCollate(pad_token_id=0)(batch)
    assert out["input_ids"].shape == (3, 4) and out["input_ids"].dtype == torch.long
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]
    assert out["input_ids"].tolist() == [[101, 5, 6, 102], [101, 102, 0, 0], [101, 7, 102, 0]]
    assert out["labels"].tolist() == [1, 0, 2]
    fixed = PadCollate(pad_token_id=9, fixed_length=6)(batch)
    assert fixed["input_ids"].shape == (3, 6) and fixed["input_ids"][1, 2:].eq(9).all()
    assert fixed["attention_mask"].sum(1).tolist() == [4, 2, 3]
    with pytest.raises(ValueError, match="fixed_length=3"):
        PadCollate(fixed_length=3)(batch)


def test_collate_agrees_with_transformers_data_collator(bundled, tokenizer):
    from transformers import DataCollatorWithPadding

    ds = data.tokenize(TextExamples(bundled.train.texts[:8], bundled.train.labels[:8]), tokenizer, 64)
    short = TextExamples([t[:80] for t in bundled.train.texts[:8]], bundled.train.labels[:8])
    ds_short = data.tokenize(short, tokenizer, 64)
    for d in (ds, ds_short):
        items = [d[i] for i in range(len(d))]
        ours = PadCollate(tokenizer.pad_token_id)(items)
        theirs = DataCollatorWithPadding(tokenizer, padding="longest", return_tensors="pt")(
            [{"input_ids": x["input_ids"], "labels": x["labels"]} for x in items])
        assert torch.equal(ours["input_ids"], theirs["input_ids"])
        assert torch.equal(ours["attention_mask"], theirs["attention_mask"])
        assert torch.equal(ours["labels"], theirs["labels"])
    assert max(ds_short.lengths) < 64  # the short texts really were padded dynamically


@pytest.mark.parametrize("n,batch_size,drop_last", [(103, 8, False), (1000, 16, False), (103, 8, True)])
def test_bucket_sampler_yields_every_index_once(n, batch_size, drop_last):
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 500, (n,), generator=g).tolist()
    sampler = LengthBucketSampler(lengths, batch_size, seed=0, drop_last=drop_last, bucket_batches=4)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    flat = [i for b in batches for i in b]
    if drop_last:
        assert len(flat) == n - n % batch_size and len(set(flat)) == len(flat)
        assert all(len(b) == batch_size for b in batches)
    else:
        assert sorted(flat) == list(range(n))
    sampler.set_epoch(1)
    assert [i for b in sampler for i in b] != flat  # a new order each epoch
    sampler.set_epoch(0)
    assert [i for b in sampler for i in b] == flat  # and the same order for the same epoch


def test_bucketing_reduces_padding_on_the_corpus(bundled, tokenizer):
    ds = data.tokenize(bundled.val, tokenizer, max_length=512)
    fracs = {p: padding_fraction(make_dataloader(ds, 16, padding=p, pad_token_id=tokenizer.pad_token_id,
                                                 fixed_length=512)) for p in ("fixed", "dynamic", "bucketed")}
    assert fracs["fixed"] >= fracs["dynamic"] > fracs["bucketed"] >= 0
    real = sum(ds.lengths)
    assert fracs["fixed"] == pytest.approx(1 - real / (512 * len(ds)))


def test_dataloader_with_workers_pickles(tokenizer):
    ds = TokenizedDataset([[101] + [5] * k + [102] for k in range(20)], [k % 3 for k in range(20)])
    pickle.dumps((ds, PadCollate(0), LengthBucketSampler(ds.lengths, 4)))
    loader = make_dataloader(ds, 4, padding="bucketed", num_workers=1)
    batches = list(loader)
    assert sorted(batches[0].keys()) == ["attention_mask", "input_ids", "labels"]
    assert sum(int(b["attention_mask"].sum()) for b in batches) == sum(ds.lengths)
    assert isinstance(loader, DataLoader)


def test_bad_inputs_are_value_errors():
    with pytest.raises(ValueError, match="padding must be one of"):
        make_dataloader(TokenizedDataset([[1]], [0]), 2, padding="smart")
    with pytest.raises(ValueError, match="batch_size"):
        LengthBucketSampler([1, 2], 0)
    with pytest.raises(ValueError, match="max_examples"):
        load_text_classification("bundled", max_examples=5, verbose=False)


def test_lazy_dataset_matches_pretokenised(bundled, tokenizer):
    from helpers.data.text import LazyTokenizedDataset

    few = TextExamples(bundled.val.texts[:6], bundled.val.labels[:6])
    lazy, eager = LazyTokenizedDataset(few, tokenizer, 64), data.tokenize(few, tokenizer, 64)
    assert [lazy[i] for i in range(6)] == [eager[i] for i in range(6)]
    loader = DataLoader(lazy, batch_size=3, collate_fn=PadCollate(tokenizer.pad_token_id), num_workers=1)
    assert sum(int(b["attention_mask"].sum()) for b in loader) == sum(eager.lengths)


# --- figures of lesson 06 (course.plots, input pipeline section) -----------------------------------

def test_lesson05_figures_are_labelled():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course.plots import length_histogram_chart, step_breakdown_chart

    fig = length_histogram_chart([10, 20, 20, 300], title="lengths", max_length=128)
    ax = fig.axes[0]
    assert ax.get_title() == "lengths" and "tokens" in ax.get_xlabel() and ax.get_legend() is not None
    fig2 = step_breakdown_chart({"data": 0.01, "forward": 0.03, "backward": 0.06}, title="one step")
    ax2 = fig2.axes[0]
    assert [t.get_text() for t in ax2.get_yticklabels()] == ["data", "forward", "backward"]
    assert "[ms]" in ax2.get_xlabel()
    assert [round(p.get_width(), 6) for p in ax2.patches] == [10.0, 30.0, 60.0]  # seconds drawn as ms
    plt.close("all")
    with pytest.raises(ValueError):
        step_breakdown_chart({}, title="x")
    with pytest.raises(ValueError):
        length_histogram_chart([], title="x")


class _FakeHubSplit:
    """Just enough of a `datasets.Dataset` for helpers.data.text's hub path."""

    def __init__(self, rows, features):
        self.rows, self.features, self.column_names = rows, features, list(rows[0])

    def __getitem__(self, column):
        return [r[column] for r in self.rows]


def _fake_datasets(monkeypatch, fail=False):
    import sys
    import types

    names = ["business", "sport", "tech"]
    rows = [{"text": f"article {i}", "label": i % 3 * 2, "label_text": names[i % 3]} for i in range(60)]

    def load_dataset(name):
        if fail:
            raise ConnectionError("no network")
        return {"train": _FakeHubSplit(rows[:45], {}), "test": _FakeHubSplit(rows[45:], {})}

    fake = types.ModuleType("datasets")
    fake.load_dataset = load_dataset
    fake.concatenate_datasets = lambda parts: _FakeHubSplit([r for p in parts for r in p.rows], {})
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.setattr(data, "_hub_unavailable_reason", lambda: None)


def test_hub_path_reads_label_text(monkeypatch):
    _fake_datasets(monkeypatch)
    splits = load_text_classification("hub", verbose=False)
    assert splits.source == "hub" and splits.label_names == ["business", "sport", "tech"]
    assert sum(splits.sizes.values()) == 60 and set(splits.train.labels) == {0, 1, 2}


def test_hub_failure_falls_back_in_auto_and_raises_in_hub(monkeypatch, capsys):
    _fake_datasets(monkeypatch, fail=True)
    splits = load_text_classification(max_examples=100)
    assert splits.source == "bundled"
    assert "failed (ConnectionError)" in capsys.readouterr().out
    with pytest.raises(ConnectionError):
        load_text_classification("hub")
    monkeypatch.setattr(data, "_hub_unavailable_reason", lambda: "HF_HUB_OFFLINE is set")
    with pytest.raises(RuntimeError, match="HF_HUB_OFFLINE"):
        load_text_classification("hub")


def test_the_sample_csv_in_data_loads_as_your_own_data(capsys):
    """course/sample_data/sample.csv: the documented format, three classes of 14, stratified three ways."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "course" / "sample_data" / "sample.csv"
    splits = load_text_classification(csv_path=path, seed=0)
    assert splits.source == "csv" and splits.label_names == ["cooking", "sport", "weather"]
    assert sum(splits.sizes.values()) == 42
    for part in (splits.train, splits.val, splits.test):  # every class in every split
        assert set(part.labels) == {0, 1, 2}
    assert "your CSV sample.csv; 42 examples, 3 classes" in capsys.readouterr().out
