"""The Table 2 row's English corpus (issue 59), built offline from Debian packages: the largest real English text
found in what the package registries serve (no Project Gutenberg texts are packaged; NLTK's corpora come from the
web). Each package is fetched with `apt-get download` and unpacked with `dpkg -x` into the ignored .table2_corpus/;
its English text becomes documents (.txt) under .table2_corpus/docs/, ready for `table2_data.py pack`.

  python benchmarks/table2_corpus.py [--work .table2_corpus]
  python benchmarks/table2_corpus.py --pack      # then pack it: 50,257-token byte-level BPE, shards, pack.json
"""

from __future__ import annotations

import argparse
import gzip
import html.parser
import re
import subprocess
import sys
from pathlib import Path

DOC_BYTES = 2_000_000  # dictionaries are cut into documents of about this size (long enough for 16K-token spans)


def _read(path: Path) -> str:
    data = gzip.open(path).read() if path.suffix in (".gz", ".dz") else path.read_bytes()
    return data.decode("utf-8", errors="replace")


class _Text(html.parser.HTMLParser):
    """The visible text of an HTML page (no scripts, styles or navigation)."""

    SKIP = {"script", "style", "nav", "head"}

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        self.skipping += tag in self.SKIP

    def handle_endtag(self, tag):
        self.skipping -= tag in self.SKIP and self.skipping > 0

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


def html_text(path: Path) -> str:
    """An HTML page's text, blank runs collapsed."""
    parser = _Text()
    parser.feed(_read(path))
    return re.sub(r"\n\s*\n+", "\n\n", "".join(parser.parts)).strip()


def chunks(text: str, size: int = DOC_BYTES) -> list[str]:
    """Cut a long text at blank lines into pieces of about `size` characters."""
    pieces, start = [], 0
    while start < len(text):
        end = text.find("\n\n", start + size)
        end = text.find("\n", start + size) if end < 0 else end  # WordNet's entries have no blank lines
        end = len(text) if end < 0 else end
        pieces.append(text[start:end].strip())
        start = end
    return [p for p in pieces if p]


# package -> (glob of its English text files, how to read one, one document per file or cut into chunks)
SOURCES = {
    "linux-doc-6.1": ("usr/share/doc/linux-doc-6.1/Documentation/**/*.rst.gz", _read, "file"),
    "python3.11-doc": ("usr/share/doc/python3.11/html/_sources/**/*.rst.txt", _read, "file"),
    "perl-doc": ("usr/share/perl/**/pod/*.pod", _read, "file"),
    "dict-gcide": ("usr/share/dictd/gcide.dict.dz", _read, "chunks"),
    "dict-wn": ("usr/share/dictd/wn.dict.dz", _read, "chunks"),
    "debian-handbook": ("usr/share/doc/debian-handbook/html/en-US/*.html", html_text, "file"),
    "debian-reference-en": ("usr/share/debian-reference/*.en.html", html_text, "file"),
}
SKIP_PATHS = ("/translations/",)  # linux-doc's Chinese, Japanese, Korean, Italian, Spanish pages


def build(work: Path) -> dict[str, tuple[int, int]]:
    """Download and unpack every package, write its documents; package -> (documents, bytes)."""
    debs, docs = work / "debs", work / "docs"
    debs.mkdir(parents=True, exist_ok=True)
    counts = {}
    for package, (pattern, read, mode) in SOURCES.items():
        if not list(debs.glob(f"{package}_*.deb")):
            subprocess.run(["apt-get", "download", package], cwd=debs, check=True)
        unpacked = work / "unpacked" / package
        if not unpacked.exists():
            unpacked.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["dpkg", "-x", str(next(debs.glob(f"{package}_*.deb"))), str(unpacked)], check=True)
        out = docs / package
        out.mkdir(parents=True, exist_ok=True)
        written = total = 0
        for path in sorted(unpacked.glob(pattern)):
            if any(s in str(path) for s in SKIP_PATHS):
                continue
            text = read(path)
            for piece in chunks(text) if mode == "chunks" else [text]:
                (out / f"{written:05d}.txt").write_text(piece)
                written, total = written + 1, total + len(piece.encode())
        counts[package] = (written, total)
        print(f"{package}: {written} documents, {total / 1e6:.1f} MB", flush=True)
    return counts


def main(argv: list[str] | None = None) -> int:
    """Build the documents; with --pack, the pack too."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", default=".table2_corpus")
    parser.add_argument("--pack", action="store_true", help="then run table2_data.py pack on the documents")
    parser.add_argument("--vocab-size", type=int, default=50257)
    args = parser.parse_args(argv)
    counts = build(Path(args.work))
    print(f"all: {sum(c[0] for c in counts.values())} documents, {sum(c[1] for c in counts.values()) / 1e6:.1f} MB")
    if args.pack:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import table2_data

        return table2_data.main(["pack", "--input", str(Path(args.work) / "docs"), "--vocab-size",
                                 str(args.vocab_size), "--name", "Debian packages' English text (" +
                                 ", ".join(SOURCES) + ")"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
