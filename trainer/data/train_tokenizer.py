"""Train the byte-level BPE tokenizer of the CPU configs on the shipped corpus.

    python -m trainer.data.train_tokenizer --corpus data/corpus.jsonl.gz --vocab-size 4096 \\
        --out data/tokenizer.json

Byte-level BPE like BLOOM's tokenizer (any UTF-8 text encodes, no unknown tokens), with BLOOM's
special tokens at BLOOM's ids: 0 <unk>, 1 <s>, 2 </s> (end of document), 3 <pad>. A vocabulary of
4096 keeps token files in uint16. `data/tokenizer.json` is shipped; this is how it was made.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Iterator
from pathlib import Path

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]


def corpus_texts(path: Path) -> Iterator[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            yield json.loads(line)["text"]


def train(corpus: Path, vocab_size: int, out: Path) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_texts(corpus), trainer=trainer)
    for token_id, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != token_id:
            raise RuntimeError(f"special token {token} got id {tokenizer.token_to_id(token)}, expected {token_id}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out))
    return {"vocab_size": tokenizer.get_vocab_size(), "eod_id": tokenizer.token_to_id("</s>")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus.jsonl.gz"))
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=Path("data/tokenizer.json"))
    args = parser.parse_args(argv)
    print(json.dumps(train(args.corpus, args.vocab_size, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
