"""The superfile format: plain-Parquet compatibility, round trips, full-text semantics, checksums."""

from __future__ import annotations

import os
import random
import shutil
import threading
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pyroaring
import pytest
import superfile.format.fulltext as fulltext
import tantivy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from superfile.errors import (
    CorruptSuperfileError,
    InvalidOptionError,
    SchemaMismatchError,
    UnknownColumnError,
    VectorDimensionError,
)
from superfile.format import (
    TOKENIZERS,
    BuiltSuperfile,
    SuperfileReader,
    SuperfileSpec,
    VectorColumnSpec,
    build_superfile,
)
from superfile.format.fulltext import TEXT_FIELD, FullTextIndex

CRANFIELD = Path(__file__).resolve().parents[3] / "examples" / "data" / "cranfield" / "docs.parquet"
SPEC = SuperfileSpec(
    fts_columns={"text": "english", "title": "simple", "author": "raw"},
    vector_columns={"embedding": VectorColumnSpec(384, "cosine")},
    row_group_size=256,  # several row groups, so row reads cross group boundaries
)


@pytest.fixture(scope="module")
def data() -> pa.Table:
    t = pq.read_table(CRANFIELD)
    ids = pa.array(np.arange(t.num_rows, dtype=np.uint64) * 3 + 7)
    return pa.table(
        {
            "title": t["title"],
            "_id": ids,  # not first on purpose: the file puts _id first
            "author": t["author"],
            "text": t["text"],
            "embedding": t["embedding"],
            "source": t["source"],
        }
    )


@pytest.fixture(scope="module")
def built(data: pa.Table) -> BuiltSuperfile:
    return build_superfile(data, SPEC)


@pytest.fixture(scope="module")
def path(built: BuiltSuperfile, tmp_path_factory: pytest.TempPathFactory) -> str:
    p = tmp_path_factory.mktemp("sf") / "cranfield.parquet"
    p.write_bytes(built.data)
    return str(p)


@pytest.fixture(scope="module")
def reader(path: str, tmp_path_factory: pytest.TempPathFactory) -> SuperfileReader:
    return SuperfileReader.open(path, name="cranfield.parquet", cache_dir=str(tmp_path_factory.mktemp("cache")))


def expected_parquet(data: pa.Table) -> pa.Table:
    return data.select(["_id", "title", "author", "text", "source"])


# -- plain Parquet ------------------------------------------------------------------------------


def test_pyarrow_reads_the_columns(data: pa.Table, path: str) -> None:
    assert pq.read_table(path).equals(expected_parquet(data))


def test_duckdb_reads_the_columns(data: pa.Table, path: str) -> None:
    rel = duckdb.sql(f"SELECT * FROM read_parquet('{path}') ORDER BY _id")
    assert rel is not None
    got = rel.to_arrow_table()
    assert got.column_names == ["_id", "title", "author", "text", "source"]
    assert got.to_pylist() == expected_parquet(data).to_pylist()


def test_footer_metadata_and_sections(built: BuiltSuperfile, path: str, data: pa.Table) -> None:
    kv = pq.read_metadata(path).metadata or {}
    assert kv[b"superfile.format"] == b"superfile"
    assert kv[b"superfile.version"] == b"1"
    assert set(built.sections) == {
        "data",
        "fts/text",
        "fts/title",
        "fts/author",
        "vec/embedding",
        "ids",
        "pageindex",
        "footer",
    }
    end = 0
    for s in built.sections.values():  # contiguous, in file order, each checksummed
        assert s.offset == end
        assert zlib.crc32(built.data[s.offset : s.offset + s.length]) == s.crc32
        end += s.length
    assert end == len(built.data)
    assert built.footer_crc32 == built.sections["footer"].crc32
    assert built.directory["data_end"] == built.sections["data"].length
    assert built.num_rows == data.num_rows


# -- reader -------------------------------------------------------------------------------------


def test_reader_round_trip(reader: SuperfileReader, data: pa.Table, built: BuiltSuperfile) -> None:
    assert reader.columns == ["_id", "title", "author", "text", "source"]
    assert reader.num_rows == data.num_rows
    assert reader.sections == built.sections
    assert reader.read().equals(expected_parquet(data))
    rows = np.array([1399, 0, 5, 256, 255, 5, 700])  # unsorted, repeated, across row groups
    got = reader.read(["text", "_id"], rows=rows)
    assert got.equals(data.select(["text", "_id"]).take(rows))
    assert reader.read(["_id"], rows=np.array([], np.int64)).num_rows == 0
    with pytest.raises(IndexError):
        reader.read(rows=np.array([data.num_rows]))
    with pytest.raises(UnknownColumnError):
        reader.read(["embedding"])


def test_reader_from_bytes_and_buffer(built: BuiltSuperfile, data: pa.Table, tmp_path: Path) -> None:
    for source in (built.data, pa.py_buffer(built.data)):
        r = SuperfileReader.open(source, name="mem", cache_dir=str(tmp_path))
        assert r.read(["_id"]).column("_id").equals(data.column("_id"))


def test_vectors_round_trip(reader: SuperfileReader, data: pa.Table) -> None:
    rows = np.array([9, 3, 1000])
    assert reader.vectors("embedding", rows).equals(data.column("embedding").combine_chunks().take(rows))
    assert reader.vectors("embedding").equals(data.column("embedding").combine_chunks())
    query = data.column("embedding")[42].values.to_numpy()
    found, _ = reader.vector_index("embedding").search(query, 1)
    assert found.tolist() == [42]


def test_vector_sections_are_aligned_in_the_file(reader: SuperfileReader) -> None:
    """The vector blob is laid out for its offset in the file: a mapped superfile's float32 views are 64-byte
    aligned, which numpy needs to hand their products to BLAS."""
    ivf = reader.vector_index("embedding").ivf_lists
    assert ivf is not None
    for name in ("centroids", "bias", "scale", "vectors", "norms"):
        assert getattr(ivf, name).ctypes.data % 64 == 0, name


# -- full text ----------------------------------------------------------------------------------


def test_tokenizers() -> None:
    def analyze(tokenizer: str, text: str) -> list[str]:
        return fulltext.make_analyzer(tokenizer).analyze(text)

    assert analyze("english", "The Running WINGS of a plane") == ["run", "wing", "plane"]
    assert analyze("simple", "Hello, World! it's") == ["hello", "world", "it", "s"]
    assert analyze("raw", "Hello, World!") == ["Hello, World!"]
    assert analyze("whitespace", "Hello, World!\tX") == ["hello,", "world!", "x"]
    assert set(TOKENIZERS) == {"english", "simple", "raw", "whitespace"}
    with pytest.raises(InvalidOptionError):
        fulltext.make_analyzer("klingon")


def test_search_finds_known_docs(reader: SuperfileReader, data: pa.Table) -> None:
    fts = reader.fulltext("text")
    assert fts.num_docs == data.num_rows and fts.tokenizer == "english"
    for row in (0, 10, 500):
        rows, scores = fts.search(fts.analyze(data.column("title")[row].as_py()), 5)
        assert rows[0] == row
        assert np.all(np.diff(scores) <= 0)
    assert reader.fulltext("text") is fts  # cached per reader


def _tantivy_top(fts: FullTextIndex, query: str, k: int, conjunction: bool) -> tuple[list[int], list[float]]:
    """Tantivy's own ranking of a query string over the same index."""
    q = fts.index.parse_query(query, [TEXT_FIELD], conjunction_by_default=conjunction)
    hits = fts.searcher.search(q, k).hits
    rows = fts.searcher.fast_field_values("_row", [a for _, a in hits])
    return [int(r) for r in rows], [s for s, _ in hits]


@pytest.mark.parametrize(
    "query", ["boundary layer", "supersonic flow over a cone", "heat transfer", "wing slipstream propeller"]
)
def test_bm25_equals_tantivy(reader: SuperfileReader, query: str) -> None:
    fts = reader.fulltext("text")
    for mode, conjunction in (("any", False), ("all", True)):
        rows, scores = fts.search(fts.analyze(query), 20, mode=mode)
        want_rows, want_scores = _tantivy_top(fts, query, 20, conjunction)
        assert rows.tolist() == want_rows
        np.testing.assert_allclose(scores, want_scores, rtol=1e-6)


def test_weights_boost_terms(reader: SuperfileReader) -> None:
    fts = reader.fulltext("text")
    rows, scores = fts.search(["boundari", "layer"], 20, weights={"boundari": 2.5})
    want_rows, want_scores = _tantivy_top(fts, "boundari^2.5 layer", 20, False)
    assert rows.tolist() == want_rows
    np.testing.assert_allclose(scores, want_scores, rtol=1e-6)
    only, _ = fts.search(["boundari", "layer"], 5, weights={"boundari": 0.0, "layer": 1.0})
    assert only.tolist() == fts.search(["layer"], 5)[0].tolist()
    with pytest.raises(InvalidOptionError):
        fts.search(["layer"], 5, weights={"layer": float("nan")})


@pytest.mark.parametrize("fraction", [0.005, 0.3, 0.9, 0.999])
def test_search_allow_gives_true_top_k(reader: SuperfileReader, fraction: float) -> None:
    fts = reader.fulltext("text")
    terms = fts.analyze("flow boundary layer pressure")
    all_rows, all_scores = fts.search(terms, fts.num_docs)
    rng = random.Random(int(fraction * 1000))
    allow = pyroaring.BitMap(rng.sample(range(fts.num_docs), max(1, int(fts.num_docs * fraction))))
    keep = np.array([r in allow for r in all_rows.tolist()], bool)
    rows, scores = fts.search(terms, 10, allow=allow)
    assert rows.tolist() == all_rows[keep][:10].tolist()
    np.testing.assert_allclose(scores, all_scores[keep][:10], rtol=1e-6)
    assert fts.search(terms, 10, allow=pyroaring.BitMap())[0].size == 0
    assert fts.search(terms, 10**12, allow=allow)[0].tolist() == all_rows[keep].tolist()  # k >> rows


def test_prefix_terms_and_doc_freq(reader: SuperfileReader, built: BuiltSuperfile) -> None:
    fts = reader.fulltext("text")
    expanded = fts.prefix_terms("separ")
    assert expanded and all(t.startswith("separ") for t in expanded)
    assert set(expanded) == {t for t in built.terms["text"] if t.startswith("separ")}
    freqs = [fts.doc_freq(t) for t in expanded]
    assert freqs == sorted(freqs, reverse=True)
    assert fts.prefix_terms("separ", limit=1) == expanded[:1]
    assert fts.doc_freq("separ") == len(fts.match(["separ"]))
    assert built.terms["text"] == sorted(built.terms["text"])
    assert 0 < fts.avg_len < 1000 and fts.total_tokens == round(fts.avg_len * fts.num_docs)


def test_match_exact_on_cranfield(reader: SuperfileReader, data: pa.Table) -> None:
    fts = reader.fulltext("author")
    value = data.column("author")[5].as_py()
    want = {i for i, v in enumerate(data.column("author").to_pylist()) if v == value}
    assert set(fts.match_exact(value)) >= want
    assert len(fts.match_exact("no such author")) == 0


TEXTS = st.lists(
    st.one_of(
        st.none(),
        st.just(""),
        st.text(alphabet=st.sampled_from(list("ab cA.,!-'é日\t")), max_size=12),
        st.sampled_from(["Hello, World!", "hello world", "HELLO", "naïve café", "x_y-z", "  ", "日本語 テキスト"]),
    ),
    min_size=1,
    max_size=30,
)


@pytest.fixture(scope="module")
def hyp_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("hyp-cache"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=TEXTS,
    tokenizer=st.sampled_from(TOKENIZERS),
    picks=st.lists(st.integers(0, 1000), min_size=1, max_size=3),
)
def test_match_and_match_exact_against_brute_force(
    hyp_cache: str, texts: list[str | None], tokenizer: str, picks: list[int]
) -> None:
    table = pa.table({"_id": pa.array(range(len(texts)), pa.uint64()), "t": pa.array(texts, pa.string())})
    built = build_superfile(table, SuperfileSpec(fts_columns={"t": tokenizer}, vector_columns={}))
    reader = SuperfileReader.open(built.data, name="hyp", cache_dir=hyp_cache)
    fts = reader.fulltext("t")
    analyzed = [set(fts.analyze(t)) if t is not None else set() for t in texts]
    vocab = sorted(set().union(*analyzed))
    assert built.terms["t"] == vocab
    terms = [vocab[p % len(vocab)] for p in picks] if vocab else ["absent"]
    assert set(fts.match(terms, "and")) == {i for i, a in enumerate(analyzed) if all(t in a for t in terms)}
    assert set(fts.match(terms, "or")) == {i for i, a in enumerate(analyzed) if any(t in a for t in terms)}
    for value in {*(t for t in texts if t is not None), "never-there"}:
        assert set(fts.match_exact(value)) == {i for i, t in enumerate(texts) if t == value}
    for prefix in {t[:1] for t in vocab}:
        assert sorted(fts.prefix_terms(prefix)) == [t for t in vocab if t.startswith(prefix)]
    if vocab:
        rows, _ = fts.search(terms, len(texts))
        assert set(rows.tolist()) == {i for i, a in enumerate(analyzed) if any(t in a for t in terms)}


def test_several_segments_are_handled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    words = np.array([f"w{i:x}" for i in range(100_000)])
    texts = [" ".join(words[rng.integers(0, len(words), 60)]) for _ in range(2000)]
    table = pa.table({"_id": pa.array(range(len(texts)), pa.uint64()), "t": texts})
    spec = SuperfileSpec(fts_columns={"t": "simple"}, vector_columns={})
    single = SuperfileReader.open(build_superfile(table, spec).data, name="one", cache_dir=str(tmp_path))
    monkeypatch.setattr(fulltext, "_WRITER_HEAP", 15_000_000)  # tantivy's minimum: forces flushes
    multi = SuperfileReader.open(build_superfile(table, spec).data, name="many", cache_dir=str(tmp_path))
    one, many = single.fulltext("t"), multi.fulltext("t")
    assert one.searcher.num_segments == 1 and many.searcher.num_segments > 1
    for row in (0, 777, 1999):
        terms = texts[row].split()[:3]
        assert set(many.match(terms)) == set(one.match(terms)) and row in many.match(terms)
        assert set(many.match_exact(texts[row])) == {row}
        r1, s1 = one.search(terms, 10)
        r2, s2 = many.search(terms, 10)
        assert dict(zip(r1.tolist(), s1.tolist(), strict=True)) == dict(zip(r2.tolist(), s2.tolist(), strict=True))
    assert many.avg_len == pytest.approx(one.avg_len)
    assert sorted(many.prefix_terms("w1")) == sorted(one.prefix_terms("w1"))
    assert many.prefix_terms("w1", limit=5) == one.prefix_terms("w1", limit=5)


def test_nulls_and_empty_table(tmp_path: Path) -> None:
    table = pa.table({"_id": pa.array([1, 2, 3], pa.uint64()), "t": pa.array([None, "", "a b"])})
    reader = SuperfileReader.open(
        build_superfile(table, SuperfileSpec(fts_columns={"t": "raw"}, vector_columns={})).data,
        name="nulls",
        cache_dir=str(tmp_path),
    )
    fts = reader.fulltext("t")
    assert set(fts.match_exact("")) == {1} and set(fts.match(["a b"])) == {2}
    assert len(fts.match_exact("None")) == 0
    empty = table.slice(0, 0)
    built = build_superfile(empty, SuperfileSpec(fts_columns={"t": "english"}, vector_columns={}))
    r = SuperfileReader.open(built.data, name="empty", cache_dir=str(tmp_path))
    assert r.num_rows == 0 and r.read().num_rows == 0 and built.terms == {"t": []}
    assert r.fulltext("t").search(["a"], 3)[0].size == 0 and r.fulltext("t").avg_len == 0.0


# -- checksums and structure --------------------------------------------------------------------


def flipped(data: bytes, pos: int) -> bytes:
    b = bytearray(data)
    b[pos] ^= 0x5A
    return bytes(b)


def flip_positions(built: BuiltSuperfile) -> Iterator[int]:
    """~40 positions: both ends, every section's edges, the footer checksum digits, and random bytes."""
    rng = random.Random(1234)
    size = len(built.data)
    yield from (0, 3, 4, size - 1, size - 5, size - 8)
    for s in built.sections.values():
        yield from (s.offset, s.offset + s.length // 2, s.offset + s.length - 1)
    footer = built.data[built.sections["footer"].offset :]
    digits = footer.rfind(b"superfile.footer_crc32") + len("superfile.footer_crc32") + 2
    yield built.sections["footer"].offset + digits
    yield from (rng.randrange(size) for _ in range(12))


def test_any_flipped_byte_is_detected(built: BuiltSuperfile, tmp_path: Path) -> None:
    footer_start = built.sections["footer"].offset
    for pos in flip_positions(built):
        bad = flipped(built.data, pos)
        with pytest.raises(CorruptSuperfileError, match=r"bad-file\.parquet"):
            SuperfileReader.open(bad, name="bad-file.parquet", cache_dir=str(tmp_path))
        if 4 <= pos < footer_start:  # data or blob: structure intact, so an unverified open works
            r = SuperfileReader.open(bad, name="bad-file.parquet", verify=False, cache_dir=str(tmp_path))
            assert r.num_rows == built.num_rows


def test_flipped_byte_in_file_on_disk(built: BuiltSuperfile, tmp_path: Path) -> None:
    p = tmp_path / "f.parquet"
    p.write_bytes(flipped(built.data, built.sections["fts/text"].offset + 100))
    with pytest.raises(CorruptSuperfileError, match=r"f\.parquet"):
        SuperfileReader.open(str(p), name=str(p), cache_dir=str(tmp_path))


def test_row_groups_are_sized_by_bytes(tmp_path: Path) -> None:
    texts = [f"{i} " + "x" * 2000 for i in range(5000)]
    table = pa.table({"_id": pa.array(range(len(texts)), pa.uint64()), "t": texts})
    built = build_superfile(table, SuperfileSpec(fts_columns={}, vector_columns={}))
    meta = pq.read_metadata(pa.BufferReader(built.data))
    assert meta.num_row_groups == 3  # ~2 KB rows, 4 MiB groups: 2048 rows each
    capped = build_superfile(table, SuperfileSpec(fts_columns={}, vector_columns={}, row_group_size=1000))
    assert pq.read_metadata(pa.BufferReader(capped.data)).num_row_groups == 5


def test_truncated_file_is_detected(built: BuiltSuperfile, tmp_path: Path) -> None:
    for size in (0, 3, 11, 100, built.sections["fts/text"].offset, len(built.data) - 9, len(built.data) - 1):
        for verify in (True, False):
            with pytest.raises(CorruptSuperfileError, match="short"):
                SuperfileReader.open(built.data[:size], name="short", verify=verify, cache_dir=str(tmp_path))


def test_expected_footer_crc(built: BuiltSuperfile, tmp_path: Path) -> None:
    SuperfileReader.open(built.data, name="x", cache_dir=str(tmp_path), expected_footer_crc32=built.footer_crc32)
    with pytest.raises(CorruptSuperfileError, match="manifest"):
        SuperfileReader.open(
            built.data, name="x", cache_dir=str(tmp_path), expected_footer_crc32=built.footer_crc32 ^ 1
        )


def test_plain_parquet_is_not_a_superfile(data: pa.Table, tmp_path: Path) -> None:
    p = tmp_path / "plain.parquet"
    pq.write_table(expected_parquet(data), p)
    with pytest.raises(CorruptSuperfileError, match=r"plain\.parquet"):
        SuperfileReader.open(str(p), name="plain.parquet", cache_dir=str(tmp_path))


# -- extraction cache and threads -----------------------------------------------------------------


def test_extraction_is_shared_and_repaired(built: BuiltSuperfile, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    readers = [SuperfileReader.open(built.data, name="dir/shared.parquet", cache_dir=cache) for _ in range(8)]
    barrier = threading.Barrier(len(readers))

    def first_search(r: SuperfileReader) -> list[int]:
        barrier.wait()
        fts = r.fulltext("text")
        return fts.search(fts.analyze("boundary layer"), 5)[0].tolist()

    with ThreadPoolExecutor(len(readers)) as pool:
        results = list(pool.map(first_search, readers))
    assert all(r == results[0] for r in results)
    (entry,) = os.listdir(cache)
    assert entry.startswith("dir_shared.parquet-") and os.listdir(os.path.join(cache, entry)) == ["text"]
    # A crash leaves a damaged extraction that no live process maps: damage a copy, not the mapped files
    # (truncating a file other readers have memory-mapped would kill this process with SIGBUS).
    damaged = str(tmp_path / "damaged")
    shutil.copytree(cache, damaged)
    extracted = os.path.join(damaged, entry, "text")
    victim = next(n for n in os.listdir(extracted) if n.endswith(".idx"))
    with open(os.path.join(extracted, victim), "r+b") as fh:
        fh.truncate(1)  # as after a crash: a later reader must not trust it
    again = SuperfileReader.open(built.data, name="dir/shared.parquet", cache_dir=damaged).fulltext("text")
    assert again.search(again.analyze("boundary layer"), 5)[0].tolist() == results[0]


def test_parallel_builds(data: pa.Table, built: BuiltSuperfile) -> None:
    spec = SuperfileSpec(fts_columns={"text": "english"}, vector_columns={}, row_group_size=256)
    part = data.slice(0, 400)
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda _: build_superfile(part, spec), range(4)))
    want = sorted(
        {t for text in part.column("text").to_pylist() for t in fulltext.make_analyzer("english").analyze(text)}
    )
    assert all(o.terms["text"] == want for o in outs)
    plain = part.select(["_id", "title", "author", "text", "embedding", "source"])  # no vector spec: a column
    assert all(pq.read_table(pa.BufferReader(o.data)).equals(plain) for o in outs)


def test_build_validation(data: pa.Table) -> None:
    small = data.slice(0, 5)
    with pytest.raises(SchemaMismatchError):
        build_superfile(small.drop_columns(["_id"]), SPEC)
    with pytest.raises(InvalidOptionError):
        build_superfile(small, SuperfileSpec(fts_columns={"text": "klingon"}, vector_columns={}))
    with pytest.raises(UnknownColumnError):
        build_superfile(small, SuperfileSpec(fts_columns={"nope": "english"}, vector_columns={}))
    with pytest.raises(InvalidOptionError):
        build_superfile(small, SuperfileSpec(fts_columns={"_id": "english"}, vector_columns={}))
    with pytest.raises(VectorDimensionError):
        build_superfile(small, SuperfileSpec(fts_columns={}, vector_columns={"embedding": VectorColumnSpec(8, "l2")}))
    with pytest.raises(SchemaMismatchError):
        build_superfile(small, SuperfileSpec(fts_columns={}, vector_columns={"title": VectorColumnSpec(8, "l2")}))


def test_tantivy_is_what_we_think(reader: SuperfileReader) -> None:
    """The facts the design leans on: stored=False text, WithFreqs indexing, a u64 row field."""
    fts = reader.fulltext("title")
    hit = fts.searcher.search(tantivy.Query.term_query(fts.index.schema, TEXT_FIELD, "wing"), 1).hits[0][1]
    assert fts.searcher.doc(hit).to_dict() == {}  # nothing stored
    with pytest.raises(ValueError):  # no positions, so no phrase queries
        fts.searcher.search(tantivy.Query.phrase_query(fts.index.schema, TEXT_FIELD, ["swept", "wing"]), 1)
