"""A few rows' values decoded straight from their Parquet data pages, compiled.

pyarrow decodes a page in ~2.5-3 us however few of its rows are wanted, behind a file and footer built for
it (``format/pages.py``): fetching 0.1% of a million rows, spread over every row group, cost ~1,000 pages of
text that way, and 3.5x less than a scan instead of the 10x an index should give. The pages a superfile writes
are few in kind: data pages (v1 or v2) of a flat column, PLAIN values (byte arrays, fixed-width numbers) or
DELTA_BINARY_PACKED integers, LZ4_RAW or uncompressed, with one bit of definition level when nullable. For
those, this kernel reads each chosen page's header, decompresses it only up to the last wanted value, walks
the levels and values to the wanted rows and copies them out: one call for all the pages of a read, the
interpreter lock released. Any other page (a codec, an encoding or a header field it does not know) answers
:data:`UNSUPPORTED` and the caller decodes with pyarrow; a page that does not parse answers :data:`CORRUPT`.
Every read is bounds-checked against the page and the file: corrupt bytes never read or write out of bounds.

Formats: the Parquet specification's ``Encodings.md`` and ``parquet.thrift`` (PageHeader, DataPageHeader,
DataPageHeaderV2), and LZ4's ``lz4_Block_format.md``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from superfile.format.compiled import compiled, pointer_to

__all__ = ["BYTES", "CORRUPT", "DELTA", "FIXED", "LZ4_DECOMPRESS", "OK", "UNSUPPORTED", "decode_rows"]

OK, UNSUPPORTED, CORRUPT = 0, 1, 2
BYTES, FIXED, DELTA = 0, 1, 2  # how values are stored: PLAIN byte arrays, PLAIN fixed width, DELTA_BINARY_PACKED

_PLAIN, _RLE, _DELTA_BINARY_PACKED = 0, 3, 5  # Parquet Encoding
_DATA_PAGE, _DATA_PAGE_V2 = 0, 3  # Parquet PageType
_MAX_DEPTH = 8  # nested Thrift structs skipped in a page header (statistics are one level)
_MARGIN = 512  # bytes decompressed past where a page's last wanted value is expected
_uint8_at = pointer_to(types.uint8)


def _lz4_decompress() -> int:
    """The address of liblz4's ``LZ4_decompress_safe_partial`` (LZ4's reference library: every Debian has it, as apt
    needs it), or 0 when it cannot be loaded: then LZ4 pages are decoded by pyarrow. numba's own loop was 7x
    slower (an LZ4 block of text is ~500 sequences a page of a few bytes each)."""
    for name in ("liblz4.so.1", None):
        try:  # the soname first; else a search (``ldconfig``, a few ms; another name on macOS)
            library = ctypes.CDLL(name or ctypes.util.find_library("lz4") or "liblz4.so")
            return ctypes.cast(library.LZ4_decompress_safe_partial, ctypes.c_void_p).value or 0
        except (OSError, AttributeError):
            continue
    return 0


LZ4_DECOMPRESS = _lz4_decompress()


@compiled
def _varint(buf: npt.NDArray[np.uint8], pos: int, end: int) -> tuple[int, int]:
    """An unsigned LEB128 varint at ``pos``: (value, next position); next position -1 past ``end``."""
    result = 0
    shift = 0
    while pos < end and shift < 64:
        byte = buf[pos]
        pos += 1
        result |= (int(byte) & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    return 0, -1


@compiled
def _unzigzag(zz: int) -> int:
    """A zigzag-coded integer's value (the shift is logical: a 64-bit value's code uses every bit)."""
    return int(np.int64(np.uint64(zz) >> np.uint64(1))) ^ -(zz & 1)


@compiled
def _header(
    buf: npt.NDArray[np.uint8], pos: int, end: int, out: npt.NDArray[np.int64], stack: npt.NDArray[np.int64]
) -> None:
    """A PageHeader's fields this kernel uses, parsed from the Thrift compact bytes at ``pos`` into ``out`` (10):
    [status, header end, page type, uncompressed size, compressed size, values, encoding, levels' bytes (v2),
    compressed (v2), definition levels' encoding (v1)]; ``stack`` (2 x _MAX_DEPTH) is scratch.
    Other fields are skipped, nested structs included; a list, set or map anywhere answers UNSUPPORTED."""
    out[:] = 0
    out[0] = CORRUPT
    out[8] = 1
    out[9] = _RLE
    last = stack[:_MAX_DEPTH]  # the last field id read at each depth
    parent = stack[_MAX_DEPTH:]  # the field id holding each depth's struct (0 at the top)
    last[0] = 0
    depth = 0
    while True:
        if pos >= end:
            return
        head = np.int64(buf[pos])
        pos += 1
        if head == 0:  # a struct's stop byte
            if depth == 0:
                out[0] = OK
                out[1] = pos
                return
            depth -= 1
            continue
        kind = head & 0x0F
        delta = head >> 4
        if delta:
            field = last[depth] + delta
        else:
            zz, pos = _varint(buf, pos, end)
            if pos < 0:
                return
            field = _unzigzag(zz)
        last[depth] = field
        if kind == 1 or kind == 2:  # a bool carries its value in its type
            if depth == 1 and parent[1] == 8 and field == 7:
                out[8] = 1 if kind == 1 else 0  # DataPageHeaderV2.is_compressed
            continue
        if kind == 3:  # byte
            pos += 1
            continue
        if kind == 4 or kind == 5 or kind == 6:  # i16, i32, i64: zigzag varints
            zz, pos = _varint(buf, pos, end)
            if pos < 0:
                return
            value = _unzigzag(zz)
            if depth == 0 and 1 <= field <= 3:
                out[1 + field] = value  # type, uncompressed size, compressed size
            elif depth == 1 and parent[1] == 5 and field == 1:
                out[5] = value  # DataPageHeader.num_values
            elif depth == 1 and parent[1] == 5 and field == 2:
                out[6] = value  # DataPageHeader.encoding
            elif depth == 1 and parent[1] == 5 and field == 3:
                out[9] = value  # DataPageHeader.definition_level_encoding
            elif depth == 1 and parent[1] == 8 and field == 1:
                out[5] = value  # DataPageHeaderV2.num_values
            elif depth == 1 and parent[1] == 8 and field == 4:
                out[6] = value  # DataPageHeaderV2.encoding
            elif depth == 1 and parent[1] == 8 and (field == 5 or field == 6):
                out[7] += value  # DataPageHeaderV2 definition and repetition levels' bytes
            continue
        if kind == 7:  # double
            pos += 8
            continue
        if kind == 8:  # binary
            n, pos = _varint(buf, pos, end)
            if pos < 0:
                return
            pos += n
            continue
        if kind == 12:  # struct
            if depth + 1 >= _MAX_DEPTH:
                out[0] = UNSUPPORTED
                return
            depth += 1
            last[depth] = 0
            parent[depth] = field if depth == 1 else -1
            continue
        if kind == 9 or kind == 10 or kind == 11:
            out[0] = UNSUPPORTED
            return
        return  # an unknown type code


def _load64_typing(_typing: Any, address: Any) -> Any:
    """The 8 bytes at ``address`` as a little-endian integer, whatever their alignment: one load (assembling
    them byte by byte made unpacking 2x slower)."""

    def codegen(context: Any, builder: Any, _signature: Any, args: Any) -> Any:
        word = ir.IntType(64)
        return builder.load(builder.inttoptr(args[0], word.as_pointer()), align=1)

    return types.uint64(types.intp), codegen


_load64: Any = intrinsic(_load64_typing)  # (numba passes the typing context)


@compiled
def _unpack(buf: npt.NDArray[np.uint8], at: int, end: int, bit: int, width: int) -> int:
    """``width`` bits (LSB first) starting ``bit`` bits after byte ``at``: one 8-byte word when it fits in the
    bytes before ``end``, else byte by byte."""
    start = at + (bit >> 3)
    shift = bit & 7
    if width <= 56 and start + 8 <= end:
        word = _load64(buf.ctypes.data + start)
        return int(np.int64((word >> np.uint64(shift)) & np.uint64((1 << width) - 1)))
    value = np.uint64(0)
    got = 0
    while got < width:
        byte = np.uint64(buf[at + (bit >> 3)])
        shift = bit & 7
        take = min(8 - shift, width - got)
        value |= ((byte >> np.uint64(shift)) & np.uint64((1 << take) - 1)) << np.uint64(got)
        got += take
        bit += take
    return int(np.int64(value))


@compiled
def _present(
    page: npt.NDArray[np.uint8], pos: int, end: int, local: npt.NDArray[np.int64], slots: npt.NDArray[np.int64]
) -> int:
    """Walk the bit-width-1 RLE / bit-packed hybrid definition levels at ``page[pos:end]``: ``slots[i]`` becomes
    the value index of row ``local[i]`` (ascending) among the page's non-null values, or -1 when it is null.
    Answers 0, or -1 when the levels end before the last row."""
    row = 0  # the level at which the current run starts
    seen = 0  # non-null values before it
    i = 0
    while i < len(local):
        head, pos = _varint(page, pos, end)
        if pos < 0:
            return -1
        if head & 1:  # bit-packed: groups of 8 levels, one byte each
            count = (head >> 1) * 8
            if pos + (head >> 1) > end:
                return -1
            while i < len(local) and local[i] < row + count:
                k = local[i] - row
                before = 0
                for j in range(k):
                    before += (page[pos + (j >> 3)] >> (j & 7)) & 1
                slots[i] = seen + before if (page[pos + (k >> 3)] >> (k & 7)) & 1 else -1
                i += 1
            for j in range(count):
                seen += (page[pos + (j >> 3)] >> (j & 7)) & 1
            pos += head >> 1
        else:  # a run of one level
            count = head >> 1
            if pos >= end:
                return -1
            level = page[pos] & 1
            pos += 1
            while i < len(local) and local[i] < row + count:
                slots[i] = seen + local[i] - row if level else -1
                i += 1
            if level:
                seen += count
        row += count
    return 0


@compiled
def _given(slots: npt.NDArray[np.int64], i: int, index: int, value: int, out: npt.NDArray[np.int64]) -> int:
    """``value``, the ``index``-th, given to the wanted slots from ``i`` on that are it: the next slot to fill
    (past the nulls, -1)."""
    while i < len(slots) and slots[i] == index:
        out[i] = value
        i += 1
        while i < len(slots) and slots[i] < 0:
            i += 1
    return i


@compiled
def _delta_values(
    page: npt.NDArray[np.uint8], pos: int, end: int, slots: npt.NDArray[np.int64], out: npt.NDArray[np.int64]
) -> int:
    """DELTA_BINARY_PACKED integers at ``page[pos:end]``: ``out[i]`` becomes value ``slots[i]`` (ascending;
    -1 skipped). Answers 0, or -1 when the values end before the last wanted one."""
    block, pos = _varint(page, pos, end)
    if pos < 0:
        return -1
    minis, pos = _varint(page, pos, end)
    if pos < 0 or minis <= 0 or block <= 0 or block % minis or (block // minis) % 8:
        return -1
    total, pos = _varint(page, pos, end)
    if pos < 0:
        return -1
    zz, pos = _varint(page, pos, end)
    if pos < 0:
        return -1
    value = _unzigzag(zz)
    per_mini = block // minis
    index = 0  # the index of ``value``
    i = 0
    while i < len(slots) and slots[i] < 0:
        i += 1
    while i < len(slots):
        i = _given(slots, i, index, value, out)
        if i >= len(slots):
            break
        if index + 1 >= total:
            return -1
        zz, pos = _varint(page, pos, end)
        if pos < 0 or pos + minis > end:
            return -1
        least = _unzigzag(zz)
        widths = pos
        pos += minis
        for m in range(minis):
            width = np.int64(page[widths + m])
            if width > 64 or pos + per_mini * width // 8 > end:
                return -1
            j = 0
            while j < per_mini and index + 1 < total:
                if width == 0:  # every delta is ``least``: straight to the next wanted value
                    step = min(per_mini - j, slots[i] - index, total - 1 - index)
                    value += least * step
                    index += step
                    j += step
                else:
                    value += least + _unpack(page, pos, end, j * width, width)  # wraps around, as encoded
                    index += 1
                    j += 1
                i = _given(slots, i, index, value, out)
                if i >= len(slots):
                    return 0
            pos += per_mini * width // 8
            if index + 1 >= total:
                break
    return 0


@compiled
def _u32(page: npt.NDArray[np.uint8], at: int) -> int:
    """The little-endian unsigned 32-bit integer at ``page[at:at + 4]``."""
    return int(page[at]) | (int(page[at + 1]) << 8) | (int(page[at + 2]) << 16) | (int(page[at + 3]) << 24)


def _copy_typing(_typing: Any, target: Any, source: Any, count: Any) -> Any:
    """``memcpy(target, source, count)`` by addresses: numba's loop or slice copy of a value of a few dozen
    bytes took 2-4x as long (measured on 62,500 titles)."""

    def codegen(context: Any, builder: Any, _signature: Any, args: Any) -> Any:
        bytes_at = ir.IntType(8).as_pointer()
        to, of = (builder.inttoptr(a, bytes_at) for a in args[:2])
        cgutils.raw_memcpy(builder, to, of, args[2], 1)
        return context.get_dummy_value()

    return types.void(types.intp, types.intp, types.intp), codegen


_copy: Any = intrinsic(_copy_typing)  # (numba passes the typing context)


def _call_lz4_typing(_typing: Any, function: Any, src: Any, dst: Any, size: Any, target: Any, capacity: Any) -> Any:
    """``LZ4_decompress_safe_partial(src, dst, size, target, capacity)`` through its address ``function``: a
    call the kernel makes without Python, and that numba can cache (an address known only at run time)."""

    def codegen(context: Any, builder: Any, _signature: Any, args: Any) -> Any:
        i32 = ir.IntType(32)
        bytes_at = ir.IntType(8).as_pointer()
        kind = ir.FunctionType(i32, [bytes_at, bytes_at, i32, i32, i32])
        call = builder.inttoptr(args[0], kind.as_pointer())
        pointers = [builder.inttoptr(a, bytes_at) for a in args[1:3]]
        sizes = [builder.trunc(a, i32) for a in args[3:6]]
        return builder.sext(builder.call(call, [*pointers, *sizes]), ir.IntType(64))

    return types.int64(types.intp, types.intp, types.intp, types.int64, types.int64, types.int64), codegen


_call_lz4: Any = intrinsic(_call_lz4_typing)  # (numba passes the typing context)


@compiled
def _reach(need: int, hi: int, full: int, lz4: int, source: int, size: int, scratch: npt.NDArray[np.uint8]) -> int:
    """How far the page's stream is available once ``need`` bytes of it are: ``hi`` when they already are,
    else the whole stream (``full`` bytes) decompressed from the ``size`` bytes at ``source`` into
    ``scratch``; -1 when the stream is shorter (corrupt), or ``lz4`` is 0 (an uncompressed stream, whole)."""
    if need <= hi:
        return hi
    if lz4 == 0 or hi >= full:
        return -1
    out = _call_lz4(lz4, source, scratch.ctypes.data, size, full, full)
    return out if out == full and need <= out else -1


@compiled
def decode_rows(
    address: int,
    size: int,
    offsets: npt.NDArray[np.int64],
    first_rows: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    page_of: npt.NDArray[np.int64],
    kind: int,
    width: int,
    nullable: bool,
    lz4: int,
) -> tuple[int, npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
    """The values of file rows ``rows`` (ascending, unique) of one flat column of the file of ``size`` bytes at
    ``address``: row ``rows[i]`` lies in the data page ``page_of[i]``, whose header starts at
    ``offsets[page_of[i]]`` and whose first row is ``first_rows[page_of[i]]`` (``first_rows`` ends with the
    file's row count). ``kind``: BYTES, FIXED (``width`` bytes a value) or DELTA (integers, given out ``width``
    bytes each); ``nullable``: one bit of definition level a row; ``lz4``: the address of liblz4's
    ``LZ4_decompress_safe_partial`` when the chunk's codec is LZ4_RAW, else 0 (UNCOMPRESSED).

    Answers (status, data, starts, valid): row ``i``'s value is ``data[starts[i]:starts[i + 1]]`` (BYTES; a
    null takes none) or ``data[i * width:(i + 1) * width]``, little-endian (a null's is zeros), and
    ``valid[i]`` is 1 unless it is null."""
    buf = numba.carray(_uint8_at(address), (size,))  # by address: numba types a read-only mapping apart
    n = len(rows)
    valid = np.ones(n, np.uint8)
    starts = np.zeros(n + 1, np.int64)
    header = np.empty(10, np.int64)
    stack = np.empty(2 * _MAX_DEPTH, np.int64)
    # sized once, from the pages' uncompressed sizes (a bound on the values they hold): an array that could
    # grow in the loop below made numba reload it at every byte, and the copy ~50x slower
    room = n * width if kind == FIXED else 0
    if kind == BYTES:
        for k in range(n):
            if k == 0 or page_of[k] != page_of[k - 1]:
                at = offsets[page_of[k]]
                if at < 0 or at >= size:
                    return CORRUPT, np.empty(0, np.uint8), starts, valid
                _header(buf, at, size, header, stack)
                if header[0] != OK:
                    return header[0], np.empty(0, np.uint8), starts, valid
                room += max(header[3], 0)
    data = np.empty(room, np.uint8) if kind == BYTES else np.zeros(room, np.uint8)
    used = 0  # bytes of ``data`` filled (BYTES)
    scratch = np.empty(0, np.uint8)
    locals_ = rows.copy()  # each row's offset in its page
    slots_ = np.empty(n, np.int64)  # each row's index among its page's non-null values, -1 for a null
    wanted_ = np.zeros(n if kind == DELTA else 0, np.int64)
    i = 0
    while i < n:
        p = page_of[i]
        stop = i
        while stop < n and page_of[stop] == p:
            locals_[stop] -= first_rows[p]
            stop += 1
        local = locals_[i:stop]
        at = offsets[p]
        count = first_rows[p + 1] - first_rows[p]  # the page's rows
        if local[0] < 0 or local[-1] >= count or at < 0 or at >= size:
            return CORRUPT, data, starts, valid
        _header(buf, at, size, header, stack)
        if header[0] != OK:
            return header[0], data, starts, valid
        body, page_type, raw_size, stored, encoding = header[1], header[2], header[3], header[4], header[6]
        if page_type != _DATA_PAGE and page_type != _DATA_PAGE_V2:
            return UNSUPPORTED, data, starts, valid
        if (encoding != _DELTA_BINARY_PACKED) if kind == DELTA else (encoding != _PLAIN):
            return UNSUPPORTED, data, starts, valid
        if page_type == _DATA_PAGE and nullable and header[9] != _RLE:
            return UNSUPPORTED, data, starts, valid
        if stored < 0 or raw_size < 0 or body + stored > size or header[5] != count:
            return CORRUPT, data, starts, valid
        # v1 stores its levels and values as one stream; v2 its levels uncompressed, then the values' stream
        levels = header[7] if page_type == _DATA_PAGE_V2 else 0
        if levels < 0 or levels > stored or levels > raw_size:
            return CORRUPT, data, starts, valid
        source, stream, full = address + body + levels, stored - levels, raw_size - levels
        codec = lz4 if lz4 and (page_type == _DATA_PAGE or header[8] != 0) else 0
        if codec:
            if len(scratch) < full:
                scratch = np.empty(full, np.uint8)
            # up to a little past where the last wanted row's value should lie, were values of equal size:
            # ~half the page on average (the rest when it lies further, by _reach)
            target = full if kind == DELTA else min(full, full * (local[-1] + 2) // count + _MARGIN)
            hi = _call_lz4(codec, source, scratch.ctypes.data, stream, target, full)
            if hi < target:
                return CORRUPT, data, starts, valid
            page, lo = scratch, 0  # the stream's bytes in ``page``, ``hi`` of them so far
        else:
            page, lo, hi = buf, body + levels, body + stored
        slots = slots_[i:stop]
        slots[:] = local
        if nullable and page_type == _DATA_PAGE_V2:
            if _present(buf, body, body + levels, local, slots) < 0:
                return CORRUPT, data, starts, valid
        elif nullable:
            hi = _reach(lo + 4, hi, full, codec, source, stream, scratch)
            if hi < 0:
                return CORRUPT, data, starts, valid
            length = _u32(page, lo)
            hi = _reach(lo + 4 + length, hi, full, codec, source, stream, scratch)
            if hi < 0 or _present(page, lo + 4, lo + 4 + length, local, slots) < 0:
                return CORRUPT, data, starts, valid
            lo += 4 + length
        if kind == DELTA:
            if _delta_values(page, lo, hi, slots, wanted_[i:stop]) < 0:
                return CORRUPT, data, starts, valid
            for k in range(stop - i):
                if slots[k] < 0:
                    valid[i + k] = 0
        elif kind == FIXED:
            for k in range(stop - i):
                start = lo + slots[k] * width
                if slots[k] < 0:
                    valid[i + k] = 0
                    continue
                hi = _reach(start + width, hi, full, codec, source, stream, scratch)
                if hi < 0:
                    return CORRUPT, data, starts, valid
                _copy(data.ctypes.data + (i + k) * width, page.ctypes.data + start, width)
        else:
            index = 0  # the value at ``lo``
            for k in range(stop - i):
                if slots[k] < 0:
                    valid[i + k] = 0
                    starts[i + k + 1] = used
                    continue
                while True:
                    hi = _reach(lo + 4, hi, full, codec, source, stream, scratch)
                    if hi < 0:
                        return CORRUPT, data, starts, valid
                    length = _u32(page, lo)
                    if index == slots[k]:
                        break
                    lo += 4 + length
                    index += 1
                hi = _reach(lo + 4 + length, hi, full, codec, source, stream, scratch)
                if hi < 0 or used + length > len(data):
                    return CORRUPT, data, starts, valid  # or more than the pages' sizes said they hold
                _copy(data.ctypes.data + used, page.ctypes.data + lo + 4, length)
                used += length
                starts[i + k + 1] = used
                lo += 4 + length
                index += 1
        i = stop
    if kind == BYTES:
        return OK, data[:used].copy() if used < len(data) // 2 else data[:used], starts, valid
    if kind == DELTA:  # the integers' low ``width`` bytes, little-endian as this machine and Parquet are
        if width == 8:
            return OK, wanted_.view(np.uint8), starts, valid
        return OK, wanted_.astype(np.int32).view(np.uint8), starts, valid
    return OK, data, starts, valid
