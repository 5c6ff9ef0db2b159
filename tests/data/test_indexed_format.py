"""Megatron's mmap indexed format: exact bytes, round trips, preprocessing end to end."""

from __future__ import annotations

import gzip
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainer.data.indexed_dataset import (
    DTYPE_CODES,
    IndexedDatasetBuilder,
    MMapIndexedDataset,
    best_fitting_dtype,
    dtype_code,
)
from trainer.data.preprocess import load_tokenizer, preprocess

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = REPO_ROOT / "data" / "tokenizer.json"


def read_megatron_index(path: Path) -> dict:
    """An independent reader written from Megatron's format description (MMapIndexedDataset.Index):
    9-byte magic, <Q version, <B dtype code, <Q len, <Q doc count, int32 sizes, int64 pointers,
    int64 doc_idx."""
    raw = path.read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack_from("<Q", raw, 9)
    (code,) = struct.unpack_from("<B", raw, 17)
    length, doc_count = struct.unpack_from("<QQ", raw, 18)
    offset = 34
    sizes = struct.unpack_from(f"<{length}i", raw, offset)
    offset += 4 * length
    pointers = struct.unpack_from(f"<{length}q", raw, offset)
    offset += 8 * length
    doc_idx = struct.unpack_from(f"<{doc_count}q", raw, offset)
    offset += 8 * doc_count
    assert offset == len(raw), "trailing bytes after doc_idx"
    return {"version": version, "code": code, "sizes": sizes, "pointers": pointers, "doc_idx": doc_idx}


def test_exact_bytes_of_a_small_file(tmp_path: Path) -> None:
    docs = [[5, 6, 7], [65000], [9, 10]]
    builder = IndexedDatasetBuilder(tmp_path / "tiny", np.uint16)
    for doc in docs:
        builder.add_document(doc)
    builder.finalize()
    # Hand-computed from the spec: 3 sequences, 4 doc_idx entries, uint16 (code 8).
    expected_idx = (
        b"MMIDIDX\x00\x00"
        + (1).to_bytes(8, "little")                      # version
        + bytes([8])                                     # dtype code uint16
        + (3).to_bytes(8, "little")                      # sequences
        + (4).to_bytes(8, "little")                      # doc_idx entries
        + b"".join(s.to_bytes(4, "little") for s in (3, 1, 2))       # sizes int32
        + b"".join(p.to_bytes(8, "little") for p in (0, 6, 8))       # byte pointers int64
        + b"".join(d.to_bytes(8, "little") for d in (0, 1, 2, 3))    # doc_idx int64
    )
    idx_bytes = (tmp_path / "tiny.idx").read_bytes()
    assert idx_bytes == expected_idx
    expected_bin = b"".join(t.to_bytes(2, "little") for doc in docs for t in doc)
    assert (tmp_path / "tiny.bin").read_bytes() == expected_bin
    parsed = read_megatron_index(tmp_path / "tiny.idx")
    print("parsed by the independent reader:", parsed)
    assert parsed == {"version": 1, "code": 8, "sizes": (3, 1, 2), "pointers": (0, 6, 8), "doc_idx": (0, 1, 2, 3)}


def test_dtype_codes_and_fitting() -> None:
    assert {code: np.dtype(t).name for code, t in DTYPE_CODES.items()} == {
        1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
    assert dtype_code(np.uint16) == 8 and dtype_code(np.int32) == 4
    assert best_fitting_dtype(4096) is np.uint16 and best_fitting_dtype(65499) is np.uint16
    assert best_fitting_dtype(65500) is np.int32 and best_fitting_dtype(250_880) is np.int32
    with pytest.raises(ValueError, match="no Megatron dtype code"):
        dtype_code(np.uint32)


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_round_trip_random_documents(random_dataset, dtype) -> None:
    prefix, docs = random_dataset(num_docs=200, seed=3, vocab=60000 if dtype is np.uint16 else 250_000, dtype=dtype)
    ds = MMapIndexedDataset(prefix)
    assert len(ds) == len(docs) and ds.dtype == np.dtype(dtype)
    assert list(ds.doc_idx) == list(range(len(docs) + 1))
    for i, doc in enumerate(docs):
        np.testing.assert_array_equal(ds[i], doc)
        if len(doc) > 3:
            np.testing.assert_array_equal(ds.get(i, 1, 2), doc[1:3])
    independent = read_megatron_index(Path(f"{prefix}.idx"))
    assert independent["sizes"] == tuple(len(d) for d in docs)
    assert independent["code"] == dtype_code(dtype)
    raw = np.fromfile(f"{prefix}.bin", dtype=dtype)
    for i, doc in enumerate(docs):
        start = independent["pointers"][i] // np.dtype(dtype).itemsize
        np.testing.assert_array_equal(raw[start : start + len(doc)], doc)


def test_token_that_does_not_fit_is_refused(tmp_path: Path) -> None:
    builder = IndexedDatasetBuilder(tmp_path / "x", np.uint16)
    with pytest.raises(ValueError, match="does not fit in uint16"):
        builder.add_document([70000])


def test_not_an_index_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "bad.idx").write_bytes(b"TNTIDX\x00\x00" + bytes(40))
    (tmp_path / "bad.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="not a Megatron mmap index"):
        MMapIndexedDataset(tmp_path / "bad")
    with pytest.raises(FileNotFoundError, match="preprocess"):
        MMapIndexedDataset(tmp_path / "missing")


def _write_inputs(tmp_path: Path) -> list[Path]:
    texts = ["Hello world, this is BLOOM.", "", "Bonjour le monde ! Ça va ?", "日本語のテキストです。", "x" * 500]
    jsonl = tmp_path / "docs.jsonl.gz"
    with gzip.open(jsonl, "wt", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({"text": text, "meta": 1}, ensure_ascii=False) + "\n")
    plain = tmp_path / "page.txt"
    plain.write_text("Привет, мир. A plain text file is one document.\n", encoding="utf-8")
    return [jsonl, plain]


def test_preprocess_matches_the_tokenizer_and_ends_documents_with_eod(tmp_path: Path) -> None:
    inputs = _write_inputs(tmp_path)
    stats = preprocess(inputs, tmp_path / "out", TOKENIZER, workers=1, quiet=True)
    tokenizer = load_tokenizer(TOKENIZER)
    eod = tokenizer.token_to_id("</s>")
    expected_texts = ["Hello world, this is BLOOM.", "Bonjour le monde ! Ça va ?", "日本語のテキストです。", "x" * 500,
                      "Привет, мир. A plain text file is one document.\n"]
    ds = MMapIndexedDataset(tmp_path / "out")
    assert stats["documents"] == len(ds) == len(expected_texts)  # the empty document is skipped
    assert ds.dtype == np.uint16
    for i, text in enumerate(expected_texts):
        ids = list(ds[i])
        assert ids[-1] == eod
        assert ids[:-1] == tokenizer.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(ids[:-1]) == text


def test_cli_with_worker_processes_gives_identical_files(tmp_path: Path) -> None:
    inputs = _write_inputs(tmp_path)
    preprocess(inputs, tmp_path / "serial", TOKENIZER, workers=1, quiet=True)
    result = subprocess.run(
        [sys.executable, "-m", "trainer.data.preprocess", "--input", *map(str, inputs),
         "--output-prefix", str(tmp_path / "parallel"), "--tokenizer", str(TOKENIZER), "--workers", "2"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    print(result.stdout.strip())
    assert json.loads(result.stdout)["documents"] == 5
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"parallel{suffix}").read_bytes() == (tmp_path / f"serial{suffix}").read_bytes()
    bad = subprocess.run(
        [sys.executable, "-m", "trainer.data.preprocess", "--input", str(tmp_path / "nope.jsonl"),
         "--output-prefix", str(tmp_path / "x"), "--tokenizer", str(TOKENIZER)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert bad.returncode == 2 and "do not exist" in bad.stderr


def test_shipped_corpus_is_multilingual_and_prepares_idempotently(corpus_prefix: str) -> None:
    from trainer.data.prepare_corpus import prepare_corpus

    again = prepare_corpus(Path(corpus_prefix).parent)
    assert again["built"] is False and again["prefix"] == corpus_prefix
    ds = MMapIndexedDataset(corpus_prefix)
    print(f"corpus: {len(ds)} documents, {ds.num_tokens} tokens, dtype {ds.dtype}")
    assert len(ds) > 1000 and ds.num_tokens > 500_000 and ds.dtype == np.uint16
    with gzip.open(REPO_ROOT / "data" / "corpus.jsonl.gz", "rt", encoding="utf-8") as handle:
        languages = {json.loads(line)["lang"] for line in handle}
    assert {"de", "fr", "ja", "ru", "zh_CN", "en"} <= languages and len(languages) >= 20


def test_reads_a_megatron_file_with_several_sequences_per_document(tmp_path: Path) -> None:
    """Megatron's preprocessing with --split-sentences writes one sequence per sentence and a
    doc_idx that groups them; int32 tokens (code 4). Written here byte by byte from the spec."""
    sentences = [[1, 2], [3], [70000, 5, 6]]
    doc_idx = [0, 2, 3]
    pointers, offset = [], 0
    for sentence in sentences:
        pointers.append(offset)
        offset += 4 * len(sentence)
    idx = (b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, len(sentences), len(doc_idx))
           + struct.pack(f"<{len(sentences)}i", *map(len, sentences))
           + struct.pack(f"<{len(sentences)}q", *pointers) + struct.pack(f"<{len(doc_idx)}q", *doc_idx))
    (tmp_path / "meg.idx").write_bytes(idx)
    (tmp_path / "meg.bin").write_bytes(b"".join(struct.pack("<i", t) for s in sentences for t in s))
    ds = MMapIndexedDataset(tmp_path / "meg")
    assert ds.dtype == np.int32 and len(ds) == 3 and list(ds.doc_idx) == doc_idx
    for i, sentence in enumerate(sentences):
        assert ds[i].tolist() == sentence
    assert ds.get(2, 1, 2).tolist() == [5, 6]
