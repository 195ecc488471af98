"""Training and held-out files for the embedding and reranker recipes, from the shared data.

    python benchmarks/embedding_data.py squad ../shared/data/squad/dev-v1.1-part-a.json OUT
    python benchmarks/embedding_data.py stsb ../shared/data/glue/STS-B/train.tsv OUT

``squad``: SQuAD questions and the paragraphs they were asked about, split by article (the
first ``--train-articles`` articles train, the rest are held out, so no held-out paragraph was
seen in training): ``OUT/train.jsonl`` ({"anchor": question, "positive": paragraph}),
``OUT/rerank-train.jsonl`` is written by ``bertforge mine`` later (see docs/embeddings.md), and
``OUT/beir/`` is a BEIR retrieval set (corpus.jsonl of every paragraph of all articles, so the
held-out questions search among the training paragraphs too; queries.jsonl and qrels/test.tsv
of the held-out questions).

``stsb``: STS-B's rows as scored pairs, shuffled with a fixed seed and split:
``OUT/train.jsonl`` and ``OUT/heldout.jsonl`` ({"sentence1", "sentence2", "score"}).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from pathlib import Path


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def squad(source: Path, out: Path, train_articles: int) -> dict:
    articles = json.loads(source.read_text(encoding="utf-8"))["data"]
    train, corpus, queries, qrels = [], [], [], []
    for a, article in enumerate(articles):
        for p, paragraph in enumerate(article["paragraphs"]):
            doc = f"a{a}p{p}"
            corpus.append({"_id": doc, "title": article["title"].replace("_", " "),
                           "text": paragraph["context"]})
            for qa in paragraph["qas"]:
                if a < train_articles:
                    train.append({"anchor": qa["question"], "positive": paragraph["context"]})
                else:
                    queries.append({"_id": qa["id"], "text": qa["question"]})
                    qrels.append((qa["id"], doc))
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "beir" / "corpus.jsonl", corpus)
    write_jsonl(out / "beir" / "queries.jsonl", queries)
    (out / "beir" / "qrels").mkdir(parents=True, exist_ok=True)
    with open(out / "beir" / "qrels" / "test.tsv", "w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        f.writelines(f"{q}\t{d}\t1\n" for q, d in qrels)
    return {"train_pairs": len(train), "corpus": len(corpus), "heldout_queries": len(queries)}


def stsb(source: Path, out: Path, heldout: int, seed: int) -> dict:
    with open(source, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        rows = [{"sentence1": r["sentence1"], "sentence2": r["sentence2"],
                 "score": float(r["score"])} for r in reader]
    random.Random(seed).shuffle(rows)
    write_jsonl(out / "heldout.jsonl", rows[:heldout])
    write_jsonl(out / "train.jsonl", rows[heldout:])
    return {"train_pairs": len(rows) - heldout, "heldout_pairs": heldout}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("squad", "stsb"))
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--train-articles", type=int, default=24,
                        help="squad: articles whose questions train (default 24 of 32)")
    parser.add_argument("--heldout", type=int, default=1500,
                        help="stsb: rows held out (default 1500, STS-B's dev size)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    report = (squad(args.source, args.out, args.train_articles) if args.kind == "squad"
              else stsb(args.source, args.out, args.heldout, args.seed))
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
