"""Build the small multilingual corpus shipped as `data/corpus.jsonl.gz` (run once, by a maintainer).

    python -m trainer.data.build_corpus --man-root /usr/share/man --out data/corpus.jsonl.gz

Source: the translated manual pages that Debian 12 installs under /usr/share/man/<lang>/ (mostly
from the manpages-l10n, man-db, dpkg, shadow and vim translation projects, GPL/free licensed),
plus English pages. Each section (`.SH`) of a page becomes one document with its language and
source page. Roff markup is stripped with a few rules: good enough for a language-model corpus,
not a man renderer. The output is deterministic for the same man pages.

The CPU configs use the shipped file, so a fresh CI machine (whose Docker image may have no man
pages at all) never runs this; `trainer.data.prepare_corpus` tokenises the shipped file.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

# The languages taken, and how many bytes of text each contributes (keeps the file ~1-2 MB gz).
DEFAULT_LANGUAGES = (
    "cs da de es fi fr hr hu id it ja ko nl pl pt pt_BR ro ru sl sr sv tr uk zh_CN zh_TW en"
).split()
DEFAULT_BYTES_PER_LANGUAGE = 160_000
MIN_DOC_CHARS = 200  # sections shorter than this (a NAME line) are merged into the next one

_ESCAPES = {
    r"\-": "-", r"\e": "\\", r"\(aq": "'", r"\(em": "\u2014", r"\(en": "\u2013", r"\(lq": "\u201c",
    r"\(rq": "\u201d", r"\(oq": "\u2018", r"\(cq": "\u2019", r"\(bu": "\u2022", r"\(co": "\u00a9",
    r"\ ": " ", r"\~": " ", r"\0": " ", r"\&": "", r"\|": "", r"\^": "", r"\c": "", r"\%": "",
}
_FONT = re.compile(r"\\f(\(..|\[[^\]]*\]|.)")
_OTHER_ESCAPE = re.compile(r"\\(\(..|\[[^\]]*\]|\*\(..|\*.|s[+-]?\d+|[a-zA-Z])")
_TEXT_MACROS = {"SH", "SS", "B", "I", "BR", "BI", "IB", "IR", "RB", "RI", "TP", "IP", "UR", "MT", "SY", "OP"}
_SECTION = "\x00SECTION\x00"


def strip_roff(source: str) -> str:
    """Roff source -> plain text. Section headings are marked with _SECTION for splitting."""
    lines = []
    for raw in source.splitlines():
        if raw.startswith(('.\\"', "'\\\"", '\\"')):
            continue
        line = raw
        if line.startswith((".", "'")):
            parts = line[1:].strip().split(None, 1)
            if not parts:
                continue
            macro, args = parts[0], (parts[1] if len(parts) > 1 else "")
            if macro not in _TEXT_MACROS:
                continue
            # Macro arguments: drop the quotes roff uses to group words.
            line = args.replace('"', "")
            if macro == "SH":
                line = f"{_SECTION}{line}"
            elif macro == "IP":
                line = line.split(" ")[0] if line else ""
        for escape, text in _ESCAPES.items():
            line = line.replace(escape, text)
        line = _FONT.sub("", line)
        line = _OTHER_ESCAPE.sub("", line)
        lines.append(line.rstrip())
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text)


def page_documents(path: Path) -> list[str]:
    """One document per section of a man page; the page name heads each one."""
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as handle:
        text = strip_roff(handle.read())
    title = path.name.removesuffix(".gz")
    documents: list[str] = []
    pending = ""
    for section in text.split(_SECTION):
        section = section.strip()
        if not section:
            continue
        pending = f"{pending}\n\n{section}" if pending else section
        if len(pending) >= MIN_DOC_CHARS:
            documents.append(f"{title}\n\n{pending}")
            pending = ""
    if pending and documents:
        documents[-1] += f"\n\n{pending}"
    elif pending:
        documents.append(f"{title}\n\n{pending}")
    return documents


def language_pages(man_root: Path, language: str) -> list[Path]:
    base = man_root if language == "en" else man_root / language
    pages = sorted(p for p in base.glob("man[1-8]/*.gz") if p.is_file() and not p.is_symlink())
    return pages


def build(man_root: Path, out: Path, languages: list[str], bytes_per_language: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    out.parent.mkdir(parents=True, exist_ok=True)
    # mtime=0: the same inputs give the same bytes, so the shipped file does not churn in git.
    with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        for language in languages:
            taken = 0
            for page in language_pages(man_root, language):
                if taken >= bytes_per_language:
                    break
                for document in page_documents(page):
                    record = {"text": document, "lang": language, "source": str(page.relative_to(man_root))}
                    gz.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
                    taken += len(document.encode("utf-8"))
                    counts[language] = counts.get(language, 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--man-root", type=Path, default=Path("/usr/share/man"))
    parser.add_argument("--out", type=Path, default=Path("data/corpus.jsonl.gz"))
    parser.add_argument("--languages", nargs="+", default=DEFAULT_LANGUAGES)
    parser.add_argument("--bytes-per-language", type=int, default=DEFAULT_BYTES_PER_LANGUAGE)
    args = parser.parse_args(argv)
    if not args.man_root.is_dir():
        print(f"build_corpus: {args.man_root} does not exist; this machine has no man pages. The shipped "
              f"data/corpus.jsonl.gz is the corpus: use it instead of rebuilding.", file=sys.stderr)
        return 2
    counts = build(args.man_root, args.out, args.languages, args.bytes_per_language)
    print(json.dumps({"out": str(args.out), "bytes": args.out.stat().st_size, "documents": counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
