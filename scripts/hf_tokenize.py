#!/usr/bin/env python3
"""Tokenises text with a Hugging Face model's own tokenizer.json, for `linac prepare --token-ids`.

linac tokenises with SentencePiece only; models whose tokenizer is a tokenizer.json (Llama 3,
SmolLM: byte-level BPE) are fed token ids instead. This helper runs outside linac (it needs the
`tokenizers` package: pip install tokenizers) and writes the one input format prepare reads
(src/data/token_ids.h): raw little-endian uint32 ids, each document's ids followed by the
model's end-of-document id. It then prints the `linac prepare` command to run.

Inputs: a .jsonl file holds one document per line (its --jsonl-key field, default "text");
any other file is one document, its whole text. Documents are encoded as transformers'
tokenizer(text) does, with the model's special tokens (Llama 3 starts each with
<|begin_of_text|>); --no-special-tokens leaves them out.

The ids mean: config.json's eos_token_id (the first, when it is a list) ends each document,
--eos-id overrides it; the vocabulary size is config.json's vocab_size (the model's embedding
rows, which may exceed the tokenizer's), else the tokenizer's size.

usage: scripts/hf_tokenize.py --model DIR --out ids/NAME.bin [--eos-id E] [--jsonl-key KEY]
                              [--no-special-tokens] INPUT...
"""
import argparse
import array
import json
import os
import sys


def documents(paths, key):
    for path in paths:
        with open(path, encoding="utf-8") as f:
            if not path.endswith(".jsonl"):
                yield f.read()
                continue
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                text = json.loads(line).get(key)
                if not isinstance(text, str):
                    sys.exit(f"{path}:{n}: no string field '{key}' (use --jsonl-key)")
                yield text


def first_id(value):
    return value[0] if isinstance(value, list) else value


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--model", required=True, help="Hugging Face model folder with tokenizer.json")
    ap.add_argument("--out", required=True, help="the .bin file to write")
    ap.add_argument("--eos-id", type=int, help="end-of-document id (default: config.json's eos_token_id)")
    ap.add_argument("--jsonl-key", default="text")
    ap.add_argument("--no-special-tokens", action="store_true")
    args = ap.parse_args()

    from tokenizers import Tokenizer  # imported here so --help works without the package

    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    config_path = os.path.join(args.model, "config.json")
    config = {}
    if os.path.exists(config_path):
        with open(config_path) as f:
            config = json.load(f)
    vocab = config.get("vocab_size") or tok.get_vocab_size(with_added_tokens=True)
    eos = args.eos_id if args.eos_id is not None else first_id(config.get("eos_token_id"))
    if eos is None:
        sys.exit(f"{config_path}: no eos_token_id; give --eos-id")
    bos = first_id(config.get("bos_token_id"))
    if not 0 <= eos < vocab:
        sys.exit(f"--eos-id {eos} is not below the vocabulary size {vocab}")

    ids = array.array("I")
    if ids.itemsize != 4:
        ids = array.array("L")
    assert ids.itemsize == 4, "no 4-byte unsigned array type"
    docs = n_ids = 0
    with open(args.out, "wb") as out:
        batch = []

        def flush():
            nonlocal n_ids
            del ids[:]
            for enc in tok.encode_batch(batch, add_special_tokens=not args.no_special_tokens):
                ids.extend(enc.ids)
                ids.append(eos)
            if sys.byteorder == "big":
                ids.byteswap()
            ids.tofile(out)
            n_ids += len(ids)
            batch.clear()

        for text in documents(args.inputs, args.jsonl_key):
            batch.append(text)
            docs += 1
            if len(batch) == 1024:
                flush()
        flush()
    if docs == 0:
        sys.exit("no documents in the inputs")
    print(f"wrote {args.out}: {docs} documents, {n_ids} ids (EOS {eos} after each)")
    bos_opt = f" --bos-id {bos}" if bos is not None and 0 <= bos < vocab else ""
    print(f"next: linac prepare --token-ids {args.out} --vocab-size {vocab} --eos-id {eos}{bos_opt} "
          f"--out data/NAME.h5")


if __name__ == "__main__":
    main()
