"""Per-superfile vector index: one self-describing blob per vector column.

Two kinds share one blob format and one search contract:

* ``"ivf"`` (default): k-means lists trained on a sample with numpy BLAS, vectors
  stored grouped by list, an int8 first pass over the probed lists (compiled:
  ``ivf_scan``) and an exact float32 rerank of the best candidates, searched as
  a union of one index (``vector_union``: the same code searches many). It builds at
  >100k vectors/s, which the ingest path needs; HNSW builds at ~11k/s here.
  Where half the dimensions or fewer hold 90% of the variance (sentence
  embeddings), the codes are of those principal components: half the bytes
  a first pass reads.
* ``"hnsw"``: a usearch graph (float16 by default) for large compacted files, with
  the same exact float32 rerank.

Both keep the original float32 vectors (the table stores them nowhere else) and
push ``allow`` filters into the ranking: few allowed rows are scanned directly,
many widen the probing until enough allowed candidates were seen. The byte
layout and the measurements behind the defaults are in ``docs/vector-index.md``.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any, Final, cast

import numpy as np
import numpy.typing as npt
from pyroaring import AbstractBitMap
from usearch.index import Index as UsearchIndex

from superfile.errors import (
    CorruptSuperfileError,
    InvalidOptionError,
    InvalidVectorError,
    VectorDimensionError,
)
from superfile.format.vector_sections import IvfLists, exact_distances, query_length
from superfile.format.vector_union import VectorUnion

__all__ = [
    "KINDS",
    "METRICS",
    "VectorIndex",
    "VectorIndexParams",
    "build_vector_blob",
    "build_vector_index",
]

METRICS: Final = ("cosine", "l2", "dot")
KINDS: Final = ("ivf", "hnsw")

MAGIC: Final = b"SFVI"
FORMAT_VERSION: Final = 2  # 2: IVF codes may be of principal components (PMEA, PROJ); 1 is still read
_VERSIONS: Final = (1, 2)
_ALIGN: Final = 64
# magic, version, kind, metric, dim, nlist, num_rows, radius, nprobe, rerank, section count, reserved
_HEADER = struct.Struct("<4sHBBIIQdIIII")  # 48 bytes
_SECTION = struct.Struct("<4sIQQ")  # tag, reserved, offset, length
_CRC = struct.Struct("<I")
_KIND_CODES: Final = {"ivf": 1, "hnsw": 2}
_METRIC_CODES: Final = {"cosine": 0, "l2": 1, "dot": 2}
_HNSW_DTYPES: Final = ("f32", "f16", "bf16")
_MAX_ROWS: Final = 2**32 - 1  # row offsets are uint32, like the roaring bitmaps that filter them
_ASSIGN_CHUNK: Final = 8192  # rows per k-means assignment matmul: bounds the (chunk, nlist) scratch

_Floats = npt.NDArray[np.float32]
_Ints = npt.NDArray[np.int64]


@dataclass(frozen=True)
class VectorIndexParams:
    """Build-time knobs; every default comes from the measurements in docs/vector-index.md.

    ``nprobe`` and ``rerank`` are the search defaults recorded in the blob, so a
    search without them gets the effort the index was built for.
    """

    kind: str = "ivf"
    nlist: int | None = None  # IVF lists; None: n / max(sqrt(n), 64), i.e. 256 lists at 64k rows
    nprobe: int | None = None  # IVF lists probed by default; None: derived from nlist
    rerank: int | None = None  # candidates rescored in float32; None: 40 (IVF; 200 with reduced codes), 160 (HNSW)
    # IVF codes of the principal components holding 90% of the variance, when that is at most half the
    # dimensions: half the bytes a first pass reads (docs/vector-index.md, "Reduced codes")
    reduce: bool = True
    train_per_list: int = 32  # k-means sample: this many rows per list (at most n)
    train_iters: int = 8
    seed: int = 0
    hnsw_connectivity: int = 16
    hnsw_expansion_add: int = 128
    hnsw_dtype: str = "f16"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidOptionError(f"vector index kind must be one of {KINDS}, got {self.kind!r}")
        if self.hnsw_dtype not in _HNSW_DTYPES:
            raise InvalidOptionError(f"hnsw_dtype must be one of {_HNSW_DTYPES}, got {self.hnsw_dtype!r}")
        for name in ("nlist", "nprobe", "rerank"):
            _check_positive(name, getattr(self, name), optional=True)
        for name in ("train_per_list", "train_iters", "hnsw_connectivity", "hnsw_expansion_add"):
            _check_positive(name, getattr(self, name))


def build_vector_index(vectors: npt.ArrayLike, metric: str, params: VectorIndexParams | None = None) -> bytes:
    """Build the index blob for ``vectors`` (row i = row offset i of the superfile).

    Raises InvalidOptionError for an unknown metric or bad params and
    InvalidVectorError for non-finite vectors (or zero vectors under cosine).
    """
    return build_vector_blob(vectors, metric, params)(0)


def build_vector_blob(
    vectors: npt.ArrayLike, metric: str, params: VectorIndexParams | None = None
) -> Callable[[int], bytes]:
    """:func:`build_vector_index` as a function of the file offset the blob is written at: its sections then
    start 64-byte aligned in the file, so the float32 views of a memory-mapped superfile are aligned and numpy
    hands their products to BLAS (unaligned, a union search over 16 superfiles took 5-9% longer:
    ``docs/vector-index.md``, "Byte layout")."""
    params = params or VectorIndexParams()
    if metric not in METRICS:
        raise InvalidOptionError(f"vector metric must be one of {METRICS}, got {metric!r}")
    x = _as_matrix(vectors)
    n, dim = x.shape
    norms = _row_norms(x, metric)
    geo = x / norms[:, None] if metric == "cosine" else x  # the space clusters and codes live in
    centroid, radius = _summary(geo, metric)
    if params.kind == "ivf":
        nlist = min(params.nlist or _default_nlist(n), n)
        nprobe = min(params.nprobe or _default_nprobe(nlist), max(nlist, 1))
        sections = _build_ivf(x, geo, norms, metric, nlist, params)
        code_dim = dict(sections)[b"CODE"].shape[1]
        rerank = params.rerank or (_IVF_RERANK if code_dim == dim else _REDUCED_RERANK)
    else:
        nlist, nprobe, code_dim = 0, 0, dim
        rerank = params.rerank or _HNSW_RERANK
        sections = _build_hnsw(x, geo, norms, metric, params)
    header = _HeaderFields(params.kind, metric, dim, n, nlist, radius, nprobe, rerank, code_dim)
    return partial(_pack, header, [(b"SUMM", centroid), *sections])


class VectorIndex:
    """A read-only view over one index blob; searches never copy the stored sections."""

    dim: int
    metric: str
    num_rows: int
    kind: str

    def __init__(self, buf: Any, header: _HeaderFields, sections: dict[bytes, memoryview]) -> None:
        self._buf = buf  # keeps the memory behind every view (and usearch's) alive
        self._h = header
        self.dim, self.metric, self.num_rows, self.kind = header.dim, header.metric, header.n, header.kind
        n, dim, nlist = header.n, header.dim, header.nlist
        self._norms = _view(sections[b"NORM"], np.float32, (n,))
        self._vecs = _view(sections[b"VECS"], np.float32, (n, dim))
        self._hnsw: UsearchIndex | None = None
        if header.kind == "ivf":
            self._lists = _view(sections[b"CENT"], np.float32, (nlist, dim))
            self._bias = _view(sections[b"CBIA"], np.float32, (nlist,))
            offsets = _view(sections[b"COFF"], np.uint32, (nlist + 1,)).astype(np.int64)
            if offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
                raise CorruptSuperfileError("<blob>", "vector index list offsets are inconsistent")
            self._offsets = offsets
            cdim = header.code_dim
            self._mean = _view(sections[b"PMEA"], np.float32, (dim,)) if cdim != dim else None
            self._proj = _view(sections[b"PROJ"], np.float32, (dim, cdim)) if cdim != dim else None
            self._scale = _view(sections[b"QSCL"], np.float32, (cdim,))
            self._row_ids = _view(sections[b"RIDS"], np.uint32, (n,))
            self._codes = _view(sections[b"CODE"], np.int8, (n, cdim))
            self._row_pos = _view(sections[b"RPOS"], np.uint32, (n,))
        else:
            self._hnsw = _restore_hnsw(sections[b"HNSW"], n, dim)

    @classmethod
    def from_buffer(cls, buf: Any) -> VectorIndex:
        """Open a blob (bytes, memoryview, pyarrow.Buffer, mmap) without copying its sections.

        Checks the header checksum and every section's bounds and size; the bulk
        sections are not checksummed here (that would read the whole blob), the
        container's checksums cover them.
        """
        try:
            mv = memoryview(buf).cast("B")
        except TypeError as exc:
            raise CorruptSuperfileError("<blob>", f"vector index is not a bytes-like buffer: {exc}") from exc
        header, sections = _parse(mv)
        return cls(buf, header, sections)

    @property
    def nlist(self) -> int:
        """Number of IVF lists (0 for HNSW)."""
        return self._h.nlist

    @property
    def default_nprobe(self) -> int:
        return self._h.nprobe

    def search(
        self,
        query: npt.ArrayLike,
        k: int,
        *,
        nprobe: int | None = None,
        rerank: int | None = None,
        allow: AbstractBitMap | None = None,
    ) -> tuple[_Ints, _Floats]:
        """The ``k`` nearest rows among ``allow`` (all rows if None), nearest first.

        Returns (row offsets int64, distances float32), at most ``k`` of each. The
        filter is applied inside the ranking, never to an unfiltered top-k.
        ``nprobe`` (IVF lists to scan at least) is ignored by HNSW; ``rerank`` is the
        number of candidates rescored exactly (for HNSW also the search breadth).
        """
        k, nprobe, rerank = self._knobs(k, nprobe, rerank)
        if self.kind == "ivf":  # a union of this one index: one IVF search for a superfile and for many
            _, rows, dist = self._union.top_each(query, k, [(0, allow)], nprobe=nprobe, rerank=rerank)
            return rows, dist
        return self._search(self.prepare_query(query), k, rerank, self._filter(allow))

    def vectors(self, rows: npt.ArrayLike) -> _Floats:
        """The original float32 vectors of these row offsets, shape (len(rows), dim)."""
        r = np.asarray(rows, dtype=np.int64).reshape(-1)
        if r.size and (r.min() < 0 or r.max() >= self.num_rows):
            raise IndexError(f"row offsets must be in [0, {self.num_rows}), got {r.min()}..{r.max()}")
        pos = self._row_pos[r] if self.kind == "ivf" else r
        return self._vecs[pos]

    @cached_property
    def ivf_lists(self) -> IvfLists | None:
        """The IVF sections (None for HNSW), for searching many superfiles' lists at once (``vector_union``)."""
        if self.kind != "ivf":
            return None
        h = self._h
        return IvfLists(
            self._lists,
            self._bias,
            self._offsets,
            self._scale,
            self._codes,
            self._vecs,
            self._norms,
            self._row_ids,
            self._row_pos,
            h.nprobe,
            h.rerank,
            self._mean,
            self._proj,
        )

    # -- search internals -------------------------------------------------------------------

    def _knobs(self, k: int, nprobe: int | None, rerank: int | None) -> tuple[int, int, int]:
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 0:
            raise InvalidOptionError(f"k must be a non-negative integer, got {k!r}")
        _check_positive("nprobe", nprobe, optional=True)
        _check_positive("rerank", rerank, optional=True)
        return int(k), int(nprobe or self._h.nprobe), int(rerank or self._h.rerank)

    def prepare_query(self, query: npt.ArrayLike) -> _Floats:
        """The query in the index's space (unit length under cosine); a typed error if it cannot be searched."""
        q = _float_array(query, "query")
        if q.ndim == 2 and q.shape[0] == 1:
            q = q[0]
        if q.ndim != 1 or q.shape[0] != self.dim:
            raise VectorDimensionError(f"query must have {self.dim} components, got shape {q.shape}")
        if not np.isfinite(q).all():
            raise InvalidVectorError("query holds NaN or infinite values")
        if self.metric == "cosine":
            norm = query_length(q)
            if norm == 0.0 or not math.isfinite(norm):
                raise InvalidVectorError("a zero query vector has no direction under the cosine metric")
            q = q / np.float32(norm)
        return np.ascontiguousarray(q)

    def _filter(self, allow: AbstractBitMap | None) -> _Filter | None:
        if allow is None:
            return None
        if not isinstance(allow, AbstractBitMap):
            raise InvalidOptionError(f"allow must be a pyroaring (Frozen)BitMap, got {type(allow).__name__}")
        n = self.num_rows
        m = allow.range_cardinality(0, n) if n else 0
        if m == n and n:
            return None  # every row allowed: the unfiltered path is the filtered answer
        rows = np.frombuffer(allow.to_array(), dtype=np.uint32)
        rows = rows[: np.searchsorted(rows, n)]
        return _Filter(rows.astype(np.int64), n)

    def _search(self, q: _Floats, k: int, rerank: int, flt: _Filter | None) -> tuple[_Ints, _Floats]:
        """An HNSW search; few candidate rows (a selective filter, or a tiny file) are scanned instead: cheaper
        than the graph, and exact where a small graph can miss rows."""
        if k == 0 or self.num_rows == 0 or (flt is not None and flt.m == 0):
            return np.empty(0, np.int64), np.empty(0, np.float32)
        # vs. a graph search whose breadth grows as n/m; scans cost ~dim
        limit = max(4 * rerank, int(_HNSW_BRUTE_PER_SQRT_N * math.sqrt(self.num_rows * 384 / self.dim)))
        if (self.num_rows if flt is None else flt.m) <= limit:
            return self._rerank(q, np.arange(self.num_rows) if flt is None else flt.pos, k)
        return self._hnsw_search(q, k, rerank, flt)

    def _rerank(self, q: _Floats, pos: _Ints, k: int) -> tuple[_Ints, _Floats]:
        """Exact float32 distances for rows ``pos``; top k by (distance, row)."""
        dist = np.empty(len(pos), dtype=np.float32)
        for s in range(0, len(pos), _GATHER_CHUNK):  # chunks stay in cache, unlike one big gather
            chunk = pos[s : s + _GATHER_CHUNK]
            # fancy indexing, not np.take(out=): a blob inside a superfile file need not be 4-byte
            # aligned, and take on an unaligned float32 view is ~1000x slower (1.7 ms for 40 rows)
            dist[s : s + len(chunk)] = exact_distances(self._vecs[chunk], q, self._norms[chunk], self.metric)
        keep = np.flatnonzero(dist <= np.partition(dist, k - 1)[k - 1]) if len(dist) > k > 0 else np.arange(len(dist))
        order = keep[np.lexsort((pos[keep], dist[keep]))][:k]
        return pos[order], dist[order]

    @cached_property
    def _union(self) -> VectorUnion:
        return VectorUnion([self])

    def _hnsw_search(self, q: _Floats, k: int, rerank: int, flt: _Filter | None) -> tuple[_Ints, _Floats]:
        assert self._hnsw is not None
        n, want = self.num_rows, max(rerank, k)
        if flt is None:
            keys = self._hnsw.search(q, want).keys.astype(np.int64)
            return self._rerank(q, keys, k)
        # the top k allowed rows sit among the nearest ~k*n/m rows: oversample by the inverse
        # selectivity, widening until k allowed rows came back; a filter that excludes the
        # query's neighbourhood ends in a direct scan once that is the cheaper of the two
        count = min(n, max(want, math.ceil(k * n / flt.m * _HNSW_OVERSAMPLE)))
        while True:
            keys = self._hnsw.search(q, count).keys.astype(np.int64)
            keys = keys[flt.mask[keys]]
            if len(keys) >= k or count >= n:
                return self._rerank(q, keys, k)
            count *= 4
            if count * _HNSW_VISIT_COST >= flt.m or count >= n:
                return self._rerank(q, flt.pos, k)


# Search tuning constants (measured, see docs/vector-index.md).
_IVF_RERANK: Final = 40
_REDUCED_RERANK: Final = 200  # principal-component codes rank less exactly: 200 lost 0.002 of recall@10, 100 0.006
_REDUCE_VARIANCE: Final = 0.9  # MiniLM 384-d: 192 components (0.914); 160 (0.875) lost 0.005-0.02 of recall@10
_REDUCE_STEP: Final = 32  # components come in multiples of this (whole SIMD blocks)
_REDUCE_MIN_ROWS_PER_DIM: Final = 4  # a covariance from fewer rows per dimension is too noisy to trust
_HNSW_RERANK: Final = 160
_HNSW_BRUTE_PER_SQRT_N: Final = 24.0
_HNSW_OVERSAMPLE: Final = 2.0
_HNSW_VISIT_COST: Final = 16  # a graph candidate costs about as much as scanning this many rows
_GATHER_CHUNK: Final = 1024  # rows per gather when scanning scattered rows


class _Filter:
    """An ``allow`` set prepared once per search: stored positions and a position mask."""

    def __init__(self, pos: _Ints, n: int) -> None:
        self.pos = pos
        self.m = len(pos)
        self._n = n

    @cached_property
    def mask(self) -> npt.NDArray[np.bool_]:
        mask = np.zeros(self._n, dtype=np.bool_)
        mask[self.pos] = True
        return mask


def _components(sample: _Floats) -> tuple[_Floats, _Floats] | None:
    """The mean and the principal axes (dim, d) of ``sample`` holding ``_REDUCE_VARIANCE`` of its variance, d a
    multiple of ``_REDUCE_STEP``; None when that is more than half the dimensions (nothing to gain) or the
    sample is too small to estimate them."""
    n, dim = sample.shape
    if dim < 2 * _REDUCE_STEP or n < _REDUCE_MIN_ROWS_PER_DIM * dim:
        return None
    mean = sample.mean(axis=0, dtype=np.float64)
    centred = (sample - mean).astype(np.float64)
    values, axes = np.linalg.eigh(centred.T @ centred)  # ascending
    values, axes = values[::-1], axes[:, ::-1]
    total = float(values.sum())
    if total <= 0:
        return None
    kept = int(np.searchsorted(np.cumsum(values) / total, _REDUCE_VARIANCE)) + 1
    d = -(-kept // _REDUCE_STEP) * _REDUCE_STEP
    if d > dim // 2:
        return None
    return mean.astype(np.float32), np.ascontiguousarray(axes[:, :d], dtype=np.float32)


# -- build -------------------------------------------------------------------------------------


def _default_nlist(n: int) -> int:
    return max(1, round(n / max(math.sqrt(n), 64.0))) if n else 0


def _default_nprobe(nlist: int) -> int:
    return max(1, min(nlist, max(8, math.ceil(3.0 * math.sqrt(nlist)))))


def _float_array(obj: npt.ArrayLike, what: str) -> _Floats:
    try:
        return np.asarray(obj, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidVectorError(f"{what} are not numeric: {exc}") from exc


def _as_matrix(vectors: npt.ArrayLike) -> _Floats:
    x = _float_array(vectors, "vectors")
    if x.ndim != 2 or x.shape[1] == 0:
        raise VectorDimensionError(f"vectors must be a 2-d (n, dim) array with dim >= 1, got shape {x.shape}")
    if x.shape[0] > _MAX_ROWS:
        raise InvalidOptionError(f"a vector index holds at most {_MAX_ROWS} rows, got {x.shape[0]}")
    return np.ascontiguousarray(x)


def _row_norms(x: _Floats, metric: str) -> _Floats:
    """Row L2 norms; a non-finite norm means a NaN/inf component (or one too large to square)."""
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    bad = np.flatnonzero(~np.isfinite(norms))
    if bad.size:
        raise InvalidVectorError(
            f"{bad.size} vector(s) hold NaN, infinite or overflowing values (first at row {bad[0]})"
        )
    if metric == "cosine":
        zero = np.flatnonzero(norms == 0)
        if zero.size:
            raise InvalidVectorError(
                f"{zero.size} zero vector(s) have no direction under cosine (first at row {zero[0]})"
            )
    return norms


def _summary(geo: _Floats, metric: str) -> tuple[_Floats, float]:
    """Centroid and radius for manifest pruning (a slightly inflated upper bound)."""
    n, dim = geo.shape
    if n == 0:
        return np.zeros(dim, np.float32), 0.0
    mean = geo.mean(axis=0, dtype=np.float64)
    if metric == "cosine":
        norm = np.linalg.norm(mean)
        center = (mean / norm if norm > 0 else geo[0].astype(np.float64)).astype(np.float32)
        worst = float((geo @ center).min())
        radius = math.acos(max(-1.0, min(1.0, worst))) + 1e-5
        return center, radius
    center = mean.astype(np.float32)
    far = 0.0
    for s in range(0, n, _ASSIGN_CHUNK):
        diff = geo[s : s + _ASSIGN_CHUNK] - center
        far = max(far, float(np.einsum("ij,ij->i", diff, diff).max()))
    return center, math.sqrt(far) * (1 + 1e-5) + 1e-6


def _build_ivf(
    x: _Floats, geo: _Floats, norms: _Floats, metric: str, nlist: int, params: VectorIndexParams
) -> list[tuple[bytes, npt.NDArray[Any]]]:
    n, dim = x.shape
    spherical = metric == "cosine"
    # dot: cluster [x, sqrt(M^2 - |x|^2)], where |q - x|^2 ranks rows as q.x does (MIPS -> NN);
    # probing by q.c alone misses large-norm rows (recall 0.88 vs 0.95 on raw GloVe)
    extra = np.sqrt(np.maximum(norms.max() ** 2 - norms**2, 0.0)) if metric == "dot" and n else None
    rng = np.random.default_rng(params.seed)
    size = params.train_per_list * nlist
    take = np.sort(rng.choice(n, size, replace=False)) if size < n else np.arange(n)
    sample = geo[take]
    basis = _components(sample) if params.reduce else None
    if extra is not None:
        sample = np.hstack([sample, extra[take, None]])
    lists = _kmeans(sample, nlist, params.train_iters, spherical, rng)
    lists = lists[_chain(lists)]  # stored so that a query's nearest lists are mostly adjacent: fewer, longer scans
    assign = _assign(geo, lists, spherical, extra)
    perm = np.argsort(assign, kind="stable")  # list order, row order inside a list
    offsets = np.zeros(nlist + 1, dtype=np.uint32)
    np.cumsum(np.bincount(assign, minlength=nlist), out=offsets[1:])
    bias = np.zeros(nlist, np.float32) if spherical else np.einsum("ij,ij->i", lists, lists)
    coded = geo  # what the codes are of, by row; in list order (perm) when they are principal components
    if basis is not None:
        mean, axes = basis
        coded = np.empty((n, axes.shape[1]), np.float32)
        for s in range(0, n, _ASSIGN_CHUNK):
            np.matmul(geo[perm[s : s + _ASSIGN_CHUNK]] - mean, axes, out=coded[s : s + _ASSIGN_CHUNK])
    peak = np.abs(coded).max(axis=0) if n else np.zeros(coded.shape[1], np.float32)
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    codes = np.empty(coded.shape, dtype=np.int8)
    for s in range(0, n, _ASSIGN_CHUNK):
        chunk = coded[perm[s : s + _ASSIGN_CHUNK]] if basis is None else coded[s : s + _ASSIGN_CHUNK]
        codes[s : s + _ASSIGN_CHUNK] = np.clip(np.rint(chunk / scale), -127, 127)
    row_pos = np.empty(n, dtype=np.uint32)
    row_pos[perm] = np.arange(n, dtype=np.uint32)
    reduced = [] if basis is None else [(b"PMEA", basis[0]), (b"PROJ", basis[1])]
    return [
        (b"CENT", np.ascontiguousarray(lists[:, :dim])),
        (b"CBIA", bias),
        (b"COFF", offsets),
        *reduced,
        (b"QSCL", scale),
        (b"RIDS", perm.astype(np.uint32)),
        (b"NORM", norms[perm]),
        (b"CODE", codes),
        (b"VECS", x[perm]),
        (b"RPOS", row_pos),
    ]


def _kmeans(sample: _Floats, nlist: int, iters: int, spherical: bool, rng: np.random.Generator) -> _Floats:
    """Lloyd's k-means (spherical for cosine) on the training sample; BLAS does the heavy lifting."""
    if nlist == 0:
        return np.zeros((0, sample.shape[1]), np.float32)
    lists = sample[rng.choice(len(sample), nlist, replace=False)].copy()
    for _ in range(iters if nlist > 1 else 0):
        assign = _assign(sample, lists, spherical, None)
        counts = np.bincount(assign, minlength=nlist)
        order = np.argsort(assign, kind="stable")
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        filled = counts > 0
        sums = np.add.reduceat(sample[order], starts[filled], axis=0, dtype=np.float64)
        lists[filled] = sums / counts[filled, None]
        if not filled.all():  # reseed empty lists on random sample rows
            lists[~filled] = sample[rng.choice(len(sample), int((~filled).sum()), replace=False)]
        if spherical:
            lists /= np.maximum(np.linalg.norm(lists, axis=1, keepdims=True), 1e-30)
    return lists


def _chain(centroids: _Floats) -> _Ints:
    """An order of the lists along a greedy nearest-neighbour path, from the list farthest from their mean.

    A search scans its probed lists in storage order, adjacent ones as one run, and the lists a query probes
    are near one another: stored along such a path, the 8 nearest of a 15,625-row superfile's 125 lists were
    4 runs instead of 7.6 (the Vaswani bench queries), fewer and longer stretches of memory to read.
    """
    n = len(centroids)
    if n <= 2:
        return np.arange(n)
    c = centroids.astype(np.float32)
    norms = np.einsum("ij,ij->i", c, c)
    dist = norms[:, None] + norms[None, :] - 2.0 * (c @ c.T)  # n^2 floats: 4 MB for a 1M-row superfile
    centred = c - c.mean(axis=0)
    at = int(np.argmax(np.einsum("ij,ij->i", centred, centred)))
    order = [at]
    far = np.zeros(n, np.float32)  # inf at the lists already on the path
    for _ in range(n - 1):
        far[at] = np.inf
        at = int(np.argmin(dist[at] + far))
        order.append(at)
    return np.array(order, np.int64)


def _assign(geo: _Floats, lists: _Floats, spherical: bool, extra: _Floats | None) -> _Ints:
    """Nearest list per row, in chunks so the (rows, nlist) score matrix stays small.

    ``extra`` is an implicit last coordinate of every row (the dot metric's augmentation).
    """
    out = np.empty(len(geo), dtype=np.int64)
    dim = geo.shape[1]
    bias = None if spherical else 0.5 * np.einsum("ij,ij->i", lists, lists)
    for s in range(0, len(geo), _ASSIGN_CHUNK):
        scores = geo[s : s + _ASSIGN_CHUNK] @ lists[:, :dim].T
        if extra is not None:
            scores += np.outer(extra[s : s + _ASSIGN_CHUNK], lists[:, dim])
        if bias is not None:  # argmin |x-c|^2 == argmax x.c - |c|^2/2
            scores -= bias
        out[s : s + _ASSIGN_CHUNK] = scores.argmax(axis=1)
    return out


def _build_hnsw(
    x: _Floats, geo: _Floats, norms: _Floats, metric: str, params: VectorIndexParams
) -> list[tuple[bytes, npt.NDArray[Any]]]:
    n, dim = x.shape
    index = UsearchIndex(
        ndim=dim,
        metric="l2sq" if metric == "l2" else "ip",
        dtype=params.hnsw_dtype,
        connectivity=params.hnsw_connectivity,
        expansion_add=params.hnsw_expansion_add,
    )
    if n:
        index.add(np.arange(n, dtype=np.uint64), geo, threads=0)
    graph = np.frombuffer(cast(bytearray, index.save()), dtype=np.uint8)  # bytes when no path
    return [(b"NORM", norms), (b"VECS", x), (b"HNSW", graph)]


def _restore_hnsw(section: memoryview, n: int, dim: int) -> UsearchIndex:
    try:
        index = UsearchIndex.restore(section, view=True)
    except Exception as exc:  # usearch raises plain RuntimeError/ValueError on bad bytes
        raise CorruptSuperfileError("<blob>", f"vector index HNSW graph is unreadable: {exc}") from exc
    if index is None or index.size != n or index.ndim != dim:
        raise CorruptSuperfileError("<blob>", "vector index HNSW graph does not match its header")
    return index


# -- blob format -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _HeaderFields:
    kind: str
    metric: str
    dim: int
    n: int
    nlist: int
    radius: float
    nprobe: int
    rerank: int
    code_dim: int  # IVF code components: dim, or fewer for principal components (not stored: PROJ's width)


_REQUIRED: Final = {
    "ivf": (b"SUMM", b"CENT", b"CBIA", b"COFF", b"QSCL", b"RIDS", b"NORM", b"CODE", b"VECS", b"RPOS"),
    "hnsw": (b"SUMM", b"NORM", b"VECS", b"HNSW"),
}


def _expected_sizes(h: _HeaderFields) -> dict[bytes, int]:
    n, dim, nlist, cdim = h.n, h.dim, h.nlist, h.code_dim
    return {
        b"SUMM": 4 * dim,
        b"CENT": 4 * nlist * dim,
        b"CBIA": 4 * nlist,
        b"COFF": 4 * (nlist + 1),
        b"PMEA": 4 * dim,
        b"PROJ": 4 * dim * cdim,
        b"QSCL": 4 * cdim,
        b"RIDS": 4 * n,
        b"NORM": 4 * n,
        b"CODE": n * cdim,
        b"VECS": 4 * n * dim,
        b"RPOS": 4 * n,
    }


def _align(x: int) -> int:
    return -(-x // _ALIGN) * _ALIGN


def _pack(h: _HeaderFields, sections: list[tuple[bytes, npt.NDArray[Any]]], base: int) -> bytes:
    """Header, section table and CRC, then each section in the given order, starting where ``base`` (the
    blob's offset in its file) plus its offset is 64-byte aligned."""
    head_len = _HEADER.size + _SECTION.size * len(sections) + _CRC.size
    table, offset = [], _align(base + head_len) - base
    for tag, arr in sections:
        table.append((tag, offset, arr.nbytes))
        offset = _align(base + offset + arr.nbytes) - base
    head = bytearray(
        _HEADER.pack(
            MAGIC,
            FORMAT_VERSION if h.code_dim != h.dim else 1,  # unreduced blobs stay readable by older readers
            _KIND_CODES[h.kind],
            _METRIC_CODES[h.metric],
            h.dim,
            h.nlist,
            h.n,
            h.radius,
            h.nprobe,
            h.rerank,
            len(sections),
            0,
        )
    )
    for tag, off, length in table:
        head += _SECTION.pack(tag, 0, off, length)
    head += _CRC.pack(zlib.crc32(head))
    parts: list[Any] = [bytes(head)]
    pos = len(head)
    for (_, off, length), (_, arr) in zip(table, sections, strict=True):
        parts.append(bytes(off - pos))
        parts.append(np.ascontiguousarray(arr).view(np.uint8).reshape(-1))
        pos = off + length
    return b"".join(parts)


def _parse(mv: memoryview) -> tuple[_HeaderFields, dict[bytes, memoryview]]:
    def corrupt(detail: str) -> CorruptSuperfileError:
        return CorruptSuperfileError("<blob>", f"vector index {detail}")

    if len(mv) < _HEADER.size:
        raise corrupt(f"blob is truncated ({len(mv)} bytes)")
    magic, version, kind_code, metric_code, dim, nlist, n, radius, nprobe, rerank, count, _ = _HEADER.unpack_from(mv)
    if magic != MAGIC:
        raise corrupt(f"has bad magic {bytes(magic)!r}")
    if version not in _VERSIONS:
        raise corrupt(f"has unsupported format version {version}")
    head_len = _HEADER.size + _SECTION.size * count + _CRC.size
    if count > 64 or len(mv) < head_len:
        raise corrupt("header is truncated")
    (crc,) = _CRC.unpack_from(mv, head_len - _CRC.size)
    if zlib.crc32(mv[: head_len - _CRC.size]) != crc:
        raise corrupt("header checksum mismatch")
    kinds = {v: k for k, v in _KIND_CODES.items()}
    metrics = {v: k for k, v in _METRIC_CODES.items()}
    if kind_code not in kinds or metric_code not in metrics or dim == 0:
        raise corrupt("header names an unknown kind or metric")
    sections: dict[bytes, memoryview] = {}
    for i in range(count):
        tag, _, off, length = _SECTION.unpack_from(mv, _HEADER.size + i * _SECTION.size)
        if off + length > len(mv):
            raise corrupt(f"section {tag!r} runs past the end of the blob (truncated?)")
        sections[tag] = mv[off : off + length]
    code_dim = dim
    if b"PROJ" in sections:
        code_dim, rest = divmod(len(sections[b"PROJ"]), 4 * dim)
        if version < 2 or kinds[kind_code] != "ivf" or rest or not 0 < code_dim < dim:  # PMEA: required below
            raise corrupt("has a malformed principal-component projection")
    h = _HeaderFields(kinds[kind_code], metrics[metric_code], dim, n, nlist, radius, nprobe, rerank, code_dim)
    expected = _expected_sizes(h)
    for tag in (*_REQUIRED[h.kind], *((b"PMEA", b"PROJ") if code_dim != dim else ())):
        if tag not in sections:
            raise corrupt(f"lacks section {tag!r}")
        if tag in expected and len(sections[tag]) != expected[tag]:
            raise corrupt(f"section {tag!r} has {len(sections[tag])} bytes, expected {expected[tag]}")
    return h, sections


def _view(section: memoryview, dtype: type[np.generic], shape: tuple[int, ...]) -> npt.NDArray[Any]:
    return np.frombuffer(section, dtype=dtype).reshape(shape)


MAX_KNOB = 1 << 20  # bound on nlist, nprobe and rerank: larger values only ask for memory


def _check_positive(name: str, value: Any, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 1 <= value <= MAX_KNOB:
        raise InvalidOptionError(f"{name} must be a positive integer of at most {MAX_KNOB}, got {value!r}")
