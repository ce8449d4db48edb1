"""Tantivy's BM25 arithmetic reproduced bit for bit (``fulltext.weight32``, ``length_norm32``, ``scores32``), and
the two means by which a share is scored as its table: paddings that give it the table's float32 average
length, and boosts that turn the share's term weights into the table's (``format/fulltext_pads.py``)."""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections import Counter

import numpy as np
import pytest
import tantivy
from superfile.format.fulltext import (
    TEXT_FIELD,
    analyzer_name,
    avgdl32,
    index_schema,
    length_norm32,
    make_analyzer,
    scores32,
    weight32,
)
from superfile.format.fulltext_pads import boosts_for, checked, pad_directories, paddings
from superfile.format.tantivy_files import fieldnorm_id

F32 = np.float32


@pytest.mark.parametrize("seed", [1, 2])
def test_scores_are_tantivy_s_to_the_bit(seed: int) -> None:
    """Random documents (lengths up to 300, so lengths are quantised) and multi-term queries: every hit's score
    is ``scores32`` of its term frequencies and quantised length, summed in query order."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(60)]
    index = tantivy.Index(index_schema("simple"), path=tempfile.mkdtemp())
    index.register_tokenizer(analyzer_name("simple"), make_analyzer("simple"))
    writer = index.writer(15_000_000, 1)
    texts = []
    for row in range(3000):
        text = [str(w) for w in rng.choice(words, int(rng.integers(1, 300)), p=np.linspace(1, 2, 60) / 90)]
        texts.append(text)
        writer.add_json(json.dumps({"_row": row, TEXT_FIELD: " ".join(text)}))
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    searcher = index.searcher()
    n, tokens = len(texts), sum(len(t) for t in texts)
    norm = length_norm32(n, tokens)
    checked_hits = 0
    for _ in range(30):
        terms = list(dict.fromkeys(str(w) for w in rng.choice(words, int(rng.integers(1, 8)))))
        query = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(index.schema, TEXT_FIELD, t)) for t in terms]
        )
        hits = searcher.search(query, 50, count=False).hits
        rows = np.asarray(searcher.fast_field_values("_row", [d for _, d in hits]), np.int64).tolist()
        weights = np.asarray([weight32(n, searcher.doc_freq(TEXT_FIELD, t)) for t in terms], np.float32)
        counts = [Counter(texts[r]) for r in rows]
        tf = np.asarray([[c[t] for c in counts] for t in terms], np.float32)
        ids = np.asarray([fieldnorm_id(len(texts[r])) for r in rows])
        expected = scores32(weights, tf, norm[ids])
        assert [F32(s) for s, _ in hits] == expected.tolist()
        checked_hits += len(hits)
    assert checked_hits > 1000


def _boost(local: np.float32, wanted: np.float32) -> float:
    """The reference: the quotient's float32 neighbours one by one, nearest first (NaN if none is exact)."""
    guess = F32(float(wanted) / float(local))
    up, down = guess, guess
    for _ in range(8):
        for b in (up, down):
            if F32(local * b) == wanted:
                return float(b)
        up, down = np.nextafter(up, F32(np.inf)), np.nextafter(down, F32(0))
    return math.nan


def test_boosts_give_the_table_s_weight_exactly() -> None:
    """Where a boost is found, tantivy's product of it and the share's weight is the table's weight; across
    realistic shares it is found for most terms (the rest are rescored)."""
    rng = np.random.default_rng(3)
    found = 0
    for _ in range(5000):
        n_table = int(rng.integers(10_000, 2_000_000))
        df_table = int(rng.integers(1, n_table // 2))
        share = int(n_table * rng.uniform(0.2, 0.5))
        df_share = max(1, min(share, int(df_table * share / n_table * rng.uniform(0.8, 1.2))))
        wanted = weight32(n_table, df_table)
        boost = boosts_for(np.asarray([share]), df_share, wanted)[0]
        if not math.isnan(boost):
            assert F32(weight32(share, df_share) * F32(boost)) == wanted
            found += 1
    assert found > 0.8 * 5000


def test_boosts_of_many_paddings_at_once_are_the_one_by_one_boosts() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        docs = np.sort(rng.integers(1_000, 500_000, 32))
        df = int(rng.integers(1, 900))
        wanted = weight32(int(rng.integers(600_000, 2_000_000)), int(rng.integers(df, 3 * df + 10)))
        each = [_boost(weight32(int(d), df), wanted) for d in docs]
        np.testing.assert_array_equal(each, boosts_for(docs, df, wanted))


@pytest.mark.parametrize(("share_docs", "share_tokens"), [(300_000, 17_900_000), (300_000, 18_400_000), (900, 55_000)])
def test_paddings_give_the_table_s_average_length(share_docs: int, share_tokens: int) -> None:
    table_docs, table_tokens = 1_000_000, 60_123_457
    found = paddings(share_docs, share_tokens, table_docs, table_tokens, 16)
    assert found, "no padding fits"
    for p in found:
        assert p.tokens >= 1 and p.docs == share_docs + p.empty + 5
        assert avgdl32(p.docs, share_tokens + p.tokens) == avgdl32(table_docs, table_tokens)
    assert len({p.docs for p in found}) == len(found)


def test_a_padded_index_is_scored_with_the_table_s_average_length() -> None:
    """The padding segments of a padding, opened beside a share's index, make tantivy's own explanation show
    the table's avgdl (what ``checked`` verifies before a padded union is used)."""
    unions = tempfile.mkdtemp()
    schema = json.dumps(json.loads(_schema_json()), sort_keys=True)
    plan = paddings(1000, 61_000, 5000, 300_007, 1)[0]
    deadline = 60.0
    start = time.monotonic()
    pads = pad_directories(unions, schema, "simple", plan)
    while pads is None and time.monotonic() - start < deadline:  # built in the background
        time.sleep(0.05)
        pads = pad_directories(unions, schema, "simple", plan)
    assert pads is not None
    docs = sum(_one(d).searcher().num_docs for d in pads)
    assert docs == plan.docs - 1000


def _one(directory: str) -> tantivy.Index:
    index = tantivy.Index.open(directory)
    index.register_tokenizer(analyzer_name("simple"), make_analyzer("simple"))
    return index


def _schema_json() -> str:
    directory = tempfile.mkdtemp()
    index = tantivy.Index(index_schema("simple"), path=directory)
    index.writer(15_000_000, 1).commit()
    with open(f"{directory}/meta.json") as fh:
        return json.dumps(json.load(fh)["schema"])


def test_checked_refuses_an_index_whose_average_length_is_not_the_table_s() -> None:
    index = tantivy.Index(index_schema("simple"), path=tempfile.mkdtemp())
    index.register_tokenizer(analyzer_name("simple"), make_analyzer("simple"))
    writer = index.writer(15_000_000, 1)
    for text in ("superfilepad superfilepad", "a b c", "a"):
        writer.add_json(json.dumps({"_row": 0, TEXT_FIELD: text}))
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    searcher = index.searcher()
    probe = tantivy.Query.term_query(index.schema, TEXT_FIELD, "superfilepad")
    assert checked(searcher, probe, 3, 6)  # its own statistics: avgdl 6 / 3
    assert not checked(searcher, probe, 3, 7)
