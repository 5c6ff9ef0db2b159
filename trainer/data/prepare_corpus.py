"""Make sure the CPU configs' token files exist, tokenised from the shipped corpus.

    python -m trainer.data.prepare_corpus --out data/corpus

writes `data/corpus/multilingual_text_document.{bin,idx}`, the dataset prefix the CPU configs name
(`data.datasets[].path: ../data/corpus/multilingual_text_document`). Idempotent: does nothing when
they exist and were made from the current corpus and tokenizer (their sha256 are recorded in
`multilingual_text_document.meta.json`); otherwise tokenises the shipped `data/corpus.jsonl.gz`
with `data/tokenizer.json` (~2 s). Safe to call from `make` and from every test session.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from orchestrator.contract import atomic_write_json
from trainer.data.indexed_dataset import data_path, index_path
from trainer.data.preprocess import preprocess

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CORPUS = REPO_ROOT / "data" / "corpus.jsonl.gz"
DEFAULT_TOKENIZER = REPO_ROOT / "data" / "tokenizer.json"
DEFAULT_OUT = REPO_ROOT / "data" / "corpus"  # a directory (ignored by git)
PREFIX_NAME = "multilingual_text_document"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prepare_corpus(out: Path = DEFAULT_OUT, corpus: Path = DEFAULT_CORPUS, tokenizer: Path = DEFAULT_TOKENIZER,
                   workers: int = 1) -> dict:
    """Returns the recorded metadata plus "prefix" (the dataset prefix to use) and "built" (whether
    this call tokenised the corpus). `out` is the output directory."""
    for path, what in ((corpus, "corpus"), (tokenizer, "tokenizer")):
        if not path.is_file():
            raise FileNotFoundError(f"the shipped {what} {path} is missing; restore it from git (data/)")
    out = Path(out) / PREFIX_NAME
    meta_path = Path(f"{out}.meta.json")
    wanted = {"corpus_sha256": _sha256(corpus), "tokenizer_sha256": _sha256(tokenizer)}
    if data_path(out).is_file() and index_path(out).is_file() and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if all(meta.get(k) == v for k, v in wanted.items()):
            return {**meta, "prefix": str(out), "built": False}
    stats = preprocess([corpus], out, tokenizer, workers=workers, quiet=True)
    meta = {**wanted, **stats, "corpus": str(corpus), "tokenizer": str(tokenizer)}
    atomic_write_json(meta_path, meta)
    return {**meta, "prefix": str(out), "built": True}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (writes {PREFIX_NAME}.bin/.idx/.meta.json)")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        result = prepare_corpus(args.out, args.corpus, args.tokenizer, args.workers)
    except FileNotFoundError as exc:
        print(f"prepare_corpus: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
