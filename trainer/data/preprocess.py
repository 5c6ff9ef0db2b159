"""Tokenise JSONL or text files into Megatron's mmap indexed format (`<prefix>.bin`/`.idx`).

    python -m trainer.data.preprocess --input docs.jsonl --output-prefix data/corpus \\
        --tokenizer data/tokenizer.json --workers 2

Input: `.jsonl`/`.json` files (optionally `.gz`) give one document per line, taken from the
`--json-key` field ("text"); any other file is one document. Each document is tokenised with a
HF `tokenizers` tokenizer, ended with the end-of-document token, and written as one sequence.
Worker processes tokenise batches in parallel; the parent writes them in input order.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from collections.abc import Iterator
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from trainer.data.indexed_dataset import IndexedDatasetBuilder, best_fitting_dtype

# Tried in order when --eod-token is not given: BLOOM's, GPT-2's, then common spellings.
EOD_CANDIDATES = ("</s>", "<|endoftext|>", "<eod>", "<eos>")
BATCH_DOCS = 64  # documents per task sent to a worker: big enough to amortise pickling

_worker_tokenizer = None
_worker_eod: int | None = None
_worker_dtype: np.dtype | None = None


def load_tokenizer(path: str | os.PathLike[str]):
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {path} does not exist (a HF `tokenizers` tokenizer.json)")
    return Tokenizer.from_file(str(path))


def find_eod_id(tokenizer, eod_token: str | None) -> int:
    candidates = (eod_token,) if eod_token else EOD_CANDIDATES
    for token in candidates:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return int(token_id)
    raise ValueError(
        f"the tokenizer has none of the end-of-document tokens {list(candidates)}; "
        f"pass --eod-token with one that is in its vocabulary"
    )


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _is_jsonl(path: Path) -> bool:
    suffixes = path.suffixes[-2:] if path.suffix == ".gz" else path.suffixes[-1:]
    return bool(suffixes) and suffixes[0] in (".jsonl", ".json")


def iter_documents(paths: list[Path], json_key: str) -> Iterator[tuple[str, int]]:
    """Yields (text, bytes of input consumed) for every document of every file, in order."""
    for path in paths:
        if _is_jsonl(path):
            with _open_text(path) as handle:
                for line_number, line in enumerate(handle, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path}:{line_number}: not valid JSON ({exc.msg})") from None
                    if json_key not in record:
                        raise ValueError(f"{path}:{line_number}: no {json_key!r} field (keys: {sorted(record)})")
                    yield str(record[json_key]), len(line.encode("utf-8"))
        else:
            with _open_text(path) as handle:
                text = handle.read()
            yield text, len(text.encode("utf-8"))


def _batches(documents: Iterator[tuple[str, int]], size: int) -> Iterator[tuple[list[str], int]]:
    texts: list[str] = []
    nbytes = 0
    for text, consumed in documents:
        texts.append(text)
        nbytes += consumed
        if len(texts) == size:
            yield texts, nbytes
            texts, nbytes = [], 0
    if texts:
        yield texts, nbytes


def _init_worker(tokenizer_path: str, eod_id: int, dtype: str) -> None:
    global _worker_tokenizer, _worker_eod, _worker_dtype
    # Each worker is one process: keep the Rust tokenizer single-threaded inside it.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker_tokenizer = load_tokenizer(tokenizer_path)
    _worker_eod = eod_id
    _worker_dtype = np.dtype(dtype)


def _encode_batch(batch: tuple[list[str], int]) -> tuple[list[np.ndarray], int]:
    texts, nbytes = batch
    encodings = _worker_tokenizer.encode_batch(texts, add_special_tokens=False)
    out = []
    for encoding in encodings:
        if not encoding.ids:  # Megatron skips empty documents instead of writing a lone EOD
            continue
        out.append(np.asarray([*encoding.ids, _worker_eod], dtype=_worker_dtype))
    return out, nbytes


class _Progress:
    """A rich progress bar on stderr when it is a terminal, else a line every few seconds."""

    def __init__(self, total_bytes: int, quiet: bool) -> None:
        self.total, self.done, self.quiet = total_bytes, 0, quiet
        self.started = self.last_print = time.monotonic()
        self._rich = None
        if not quiet and sys.stderr.isatty():
            from rich.progress import Progress

            self._rich = Progress(transient=False)
            self._rich.start()
            self._task = self._rich.add_task("tokenising", total=total_bytes)

    def advance(self, nbytes: int, docs: int) -> None:
        self.done += nbytes
        if self.quiet:
            return
        if self._rich is not None:
            self._rich.update(self._task, completed=self.done, description=f"tokenising ({docs} docs)")
            return
        now = time.monotonic()
        if now - self.last_print > 2.0:
            self.last_print = now
            pct = 100.0 * self.done / max(self.total, 1)
            mb_s = self.done / 1e6 / max(now - self.started, 1e-9)
            print(f"preprocess: {pct:5.1f}% {docs} docs {mb_s:.1f} MB/s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()


def preprocess(
    inputs: list[str | os.PathLike[str]],
    output_prefix: str | os.PathLike[str],
    tokenizer_path: str | os.PathLike[str],
    workers: int = 1,
    json_key: str = "text",
    eod_token: str | None = None,
    quiet: bool = False,
) -> dict[str, int | str]:
    """Tokenise `inputs` into `<output_prefix>.bin/.idx`. Returns counts for the caller to print."""
    paths = [Path(p) for p in inputs]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"input files do not exist: {missing}")
    tokenizer = load_tokenizer(tokenizer_path)
    eod_id = find_eod_id(tokenizer, eod_token)
    dtype = np.dtype(best_fitting_dtype(tokenizer.get_vocab_size()))
    builder = IndexedDatasetBuilder(output_prefix, dtype)
    progress = _Progress(sum(p.stat().st_size for p in paths), quiet)
    batches = _batches(iter_documents(paths, json_key), BATCH_DOCS)
    init_args = (str(tokenizer_path), eod_id, dtype.str)
    try:
        if workers <= 1:
            _init_worker(*init_args)
            results = map(_encode_batch, batches)
            _consume(results, builder, progress)
        else:
            with Pool(workers, initializer=_init_worker, initargs=init_args) as pool:
                # imap keeps input order, so the output is identical for any number of workers.
                _consume(pool.imap(_encode_batch, batches, chunksize=4), builder, progress)
        builder.finalize()
    finally:
        progress.close()
    return {
        "documents": builder.num_documents,
        "tokens": builder.num_tokens,
        "dtype": str(dtype),
        "eod_id": eod_id,
        "vocab_size": tokenizer.get_vocab_size(),
    }


def _consume(results, builder: IndexedDatasetBuilder, progress: _Progress) -> None:
    for documents, nbytes in results:
        for tokens in documents:
            builder.add_document(tokens)
        progress.advance(nbytes, builder.num_documents)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", required=True, help="JSONL (.jsonl/.json[.gz]) or text files")
    parser.add_argument("--output-prefix", required=True, help="writes <prefix>.bin and <prefix>.idx")
    parser.add_argument("--tokenizer", required=True, help="HF tokenizers file (tokenizer.json)")
    parser.add_argument("--workers", type=int, default=1, help="tokenising processes")
    parser.add_argument("--json-key", default="text", help="field of each JSONL record holding the text")
    parser.add_argument("--eod-token", default=None, help=f"end-of-document token (default: first of {EOD_CANDIDATES})")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        stats = preprocess(args.input, args.output_prefix, args.tokenizer, args.workers, args.json_key,
                           args.eod_token, args.quiet)
    except (FileNotFoundError, ValueError) as exc:
        print(f"preprocess: error: {exc}", file=sys.stderr)
        return 2
    stats["seconds"] = round(time.monotonic() - started, 3)
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
