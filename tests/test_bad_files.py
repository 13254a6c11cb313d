"""Issue 20: files a new user really has (Excel exports, pasted files, other encodings, a damaged corpus)
are read, or refused with a ValueError naming the file, the line and the fix; never a bare library error."""

from __future__ import annotations

import gzip

import pytest

from helpers.data import corpus
from helpers.data.corpus import read_csv_corpus
from helpers.data.text import load_text_classification


def _rows(n: int = 12) -> str:
    return "".join(f"sentence number {i},{'ab'[i % 2]}\n" for i in range(n))


def test_excel_csv_utf8_with_a_byte_order_mark_is_read(tmp_path):
    f = tmp_path / "excel.csv"
    f.write_bytes(b"\xef\xbb\xbf" + ("text,label\r\n" + _rows().replace("\n", "\r\n")).encode())
    splits = load_text_classification(csv_path=f, verbose=False)
    assert splits.label_names == ["a", "b"] and sum(splits.sizes.values()) == 12
    assert not any("\ufeff" in t for t in splits.train.texts)


@pytest.mark.parametrize("dedupe", [True, False])
def test_a_header_repeated_inside_the_file_is_refused_with_its_line(tmp_path, dedupe):
    f = tmp_path / "pasted.csv"
    f.write_text("text,label\n" + _rows() + "text,label\n" + _rows(), encoding="utf-8")
    with pytest.raises(ValueError, match=r"pasted.csv.*lines \[14\] repeat the header line"):
        load_text_classification(csv_path=f, dedupe=dedupe, verbose=False)
    g = tmp_path / "pasted_excel.csv"  # the second export brought its own byte-order mark
    g.write_bytes(b"\xef\xbb\xbftext,label\n" + _rows(6).encode() + b"\xef\xbb\xbftext,label\n"
                  + _rows(6).encode())
    with pytest.raises(ValueError, match=r"lines \[8\] repeat the header"):
        read_csv_corpus(g)


def test_a_column_named_twice_is_refused(tmp_path):
    f = tmp_path / "twice.csv"
    f.write_text("text,label,text\n" + "".join(f"a {i},{'ab'[i % 2]},b {i}\n" for i in range(12)),
                 encoding="utf-8")
    with pytest.raises(ValueError, match=r"twice.csv.*names \['text'\] more than once.*rename or delete"):
        load_text_classification(csv_path=f, verbose=False)


def test_a_10_mb_text_field_is_read(tmp_path):
    f = tmp_path / "long.csv"
    long = "word " * (2 * 2**20)  # 10 MiB in one field: csv's default limit is 128 KiB
    f.write_text(f'text,label\n"{long}",a\n' + _rows(), encoding="utf-8")
    texts, labels, names = read_csv_corpus(f)
    assert len(texts) == 13 and texts[0] == long and names == ["a", "b"]
    import csv

    assert csv.field_size_limit() == 131072  # the process-wide limit is put back


@pytest.mark.parametrize("kind", ["latin-1", "utf-16", "utf-16-no-bom", "gzip", "xlsx"])
def test_other_encodings_name_the_file_the_encoding_and_the_fix(tmp_path, kind):
    text = "text,label\n" + "".join(f"caf\u00e9 no. {i},{'ab'[i % 2]}\n" for i in range(12))
    raw = {"latin-1": text.encode("latin-1"), "utf-16": text.encode("utf-16"),
           "utf-16-no-bom": text.encode("utf-16-le"), "gzip": gzip.compress(text.encode()),
           "xlsx": b"PK\x03\x04" + b"\x00" * 40}[kind]
    f = tmp_path / f"{kind}.csv"
    f.write_bytes(raw)
    found = {"latin-1": r"not UTF-8: byte 0xe9 on line 2.*Latin-1.*CSV UTF-8.*iconv",
             "utf-16": r"UTF-16.*CSV UTF-8.*iconv -f UTF-16", "utf-16-no-bom": r"UTF-16.*iconv -f UTF-16",
             "gzip": r"gzip-compressed: decompress it first \(gunzip", "xlsx": r"Excel workbook"}[kind]
    with pytest.raises(ValueError, match=rf"{kind}.csv.*{found}"):
        load_text_classification(csv_path=f, verbose=False)


def test_an_empty_bundled_article_is_skipped_with_a_printed_count(tmp_path, monkeypatch, capsys):
    for name in ("business", "sport"):
        (tmp_path / name).mkdir()
        for i in range(15):
            (tmp_path / name / f"{i:03d}.txt").write_text(f"{name} story {i}\n\nbody {i}.", encoding="utf-8")
    (tmp_path / "sport" / "002.txt").write_bytes(b"")  # truncated to 0 bytes
    (tmp_path / "business" / "004.txt").write_bytes(b"  \n")
    monkeypatch.setattr(corpus, "bundled_corpus_path", lambda: tmp_path)
    texts, labels, names = corpus.read_bundled_corpus()
    assert len(texts) == 28 and all(t for t in texts) and labels.count(1) == 14
    out = capsys.readouterr().out
    assert "skipped 2 empty article file(s)" in out and "business/004.txt, sport/002.txt" in out
    splits = load_text_classification("bundled", val_frac=0.2, test_frac=0.2, verbose=False)
    assert "" not in splits.train.texts + splits.val.texts + splits.test.texts


def test_a_row_the_csv_parser_rejects_is_a_value_error_naming_file_and_line(tmp_path, monkeypatch):
    import csv

    f = tmp_path / "broken.csv"
    f.write_text("text,label\n" + _rows(6), encoding="utf-8")
    real_reader = csv.reader

    class FailsOnLine4:  # what csv raises for a malformed row (e.g. a field past the field size limit)
        def __init__(self, *args, **kwargs):
            self.reader = real_reader(*args, **kwargs)

        def __iter__(self):
            return self

        def __next__(self):
            if self.reader.line_num == 3:
                raise csv.Error("field larger than field limit (131072)")
            return next(self.reader)

        @property
        def line_num(self):
            return self.reader.line_num + (self.reader.line_num == 3)

    monkeypatch.setattr(csv, "reader", FailsOnLine4)
    with pytest.raises(ValueError, match=r"broken.csv.*cannot parse line 4 \(field larger than field limit"):
        load_text_classification(csv_path=f, verbose=False)
