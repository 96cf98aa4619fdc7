"""Page-access traces: synthetic generators after gpu_ext's workloads and
microbenchmarks (docs/references.md, "gpu_ext"), and a CSV format to import and export them.

A trace is five columns, one row per 4 KB page access, in issue order: ``tenant``, ``block`` (the 2 MB VA
block), ``page`` (0–511 inside it), ``op`` (0 read, 1 write) and ``time``. ``time`` is a logical issue step:
accesses with the same time are issued concurrently (their faults coalesce into the same batches), a later
time waits for earlier faults to be serviced. Tenants own VA blocks: a block belongs to one tenant.

An optional sixth column, ``stream``, names the GPU thread (warp) that issues each access. With it the
simulator lets every stream run ahead on its own — a stream waits only for its own fault, as a GPU warp
stalls only on its own replayable fault — and ``time`` orders accesses only inside a stream and across
kernels: a stream starts once every stream whose last access comes before its first access has finished
(a kernel launch waits for the previous kernel). The uvmbench tier-0 generators, whose threads are
described in gpu_ext ``microbench/memory/kernels/synthetic.cuh``, emit it: one stream id per (kernel
launch, thread).

Generators follow the access shapes of gpu_ext's ``docs/profiling/WORKLOAD_ANALYSIS.md`` and
uvmbench kernels at a scale a laptop sweeps in seconds (tens to a
few hundred 2 MB blocks). Parallel GPU threads are modelled as ``streams`` that each own a contiguous
tile and advance one page per step, as in uvmbench's tier-0 kernels. Every generator takes
``seed`` (fixed default 0) and ``scale`` (multiplies the data size or the trace length).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpuslice.errors import TraceFormatError, UnknownName
from gpuslice.inputs import InvalidInput, read_text
from gpuslice.memory.uvm import PAGES_PER_BLOCK

__all__ = ["WORKLOADS", "Trace", "UnknownWorkload", "make_workload", "read_trace_csv", "write_trace_csv"]

_P = PAGES_PER_BLOCK


class UnknownWorkload(UnknownName):
    """A memsim workload name is not in the registry."""


@dataclass(frozen=True)
class Trace:
    """Columns of a page-access trace (see the module docstring); ``owner[block]`` = owning tenant."""

    name: str
    tenant: np.ndarray
    block: np.ndarray
    page: np.ndarray
    op: np.ndarray
    time: np.ndarray
    owner: np.ndarray
    stream: np.ndarray | None = None  # issuing thread per access (module docstring); None = lockstep

    def __len__(self) -> int:
        return len(self.block)

    @property
    def blocks(self) -> int:
        """Size of the block id space (max block + 1)."""
        return len(self.owner)

    @property
    def working_set_blocks(self) -> int:
        """Distinct VA blocks the trace touches: the memory it needs, in 2 MB chunks."""
        return int(np.unique(self.block).size)

    @property
    def tenants(self) -> int:
        return int(self.tenant.max()) + 1 if len(self) else 0

    @classmethod
    def from_columns(cls, name, tenant, block, page, op, time, stream=None) -> Trace:
        """Build and check a trace: pages in range, times non-decreasing, one tenant per block, streams
        (if given) >= 0."""
        tenant = np.asarray(tenant, dtype=np.int16)
        block = np.asarray(block, dtype=np.int32)
        page = np.asarray(page, dtype=np.int16)
        op = np.asarray(op, dtype=np.int8)
        time = np.asarray(time, dtype=np.int64)
        if len(block) and (page.min() < 0 or page.max() >= _P or block.min() < 0 or tenant.min() < 0):
            raise TraceFormatError(f"trace {name!r}: page must be 0-511, block and tenant >= 0")
        if np.any(np.diff(time) < 0):
            raise TraceFormatError(f"trace {name!r}: time must not decrease from one row to the next")
        owner = np.full(int(block.max()) + 1 if len(block) else 0, -1, dtype=np.int16)
        owner[block] = tenant
        if np.any(owner[block] != tenant):
            bad = int(block[np.flatnonzero(owner[block] != tenant)[0]])
            raise TraceFormatError(
                f"trace {name!r}: VA block {bad} is used by two tenants; a block has one owner"
            )
        owner[owner < 0] = 0
        if stream is not None:
            stream = np.asarray(stream, dtype=np.int64)
            if len(stream) != len(block) or (len(stream) and stream.min() < 0):
                raise TraceFormatError(f"trace {name!r}: stream must be given for every row and be >= 0")
        return cls(name, tenant, block, page, op, time, owner, stream)


class _Builder:
    """Appends groups of global page numbers (block * 512 + page); each group of ``width`` is one step."""

    def __init__(self) -> None:
        self.pages: list[np.ndarray] = []
        self.steps: list[np.ndarray] = []
        self.ops: list[np.ndarray] = []
        self.streams: list[np.ndarray] = []
        self.next_stream = 0
        self.step = 0

    def add(self, pages: np.ndarray, width: int = 1, op: int = 0) -> None:
        pages = np.asarray(pages, dtype=np.int64).ravel()
        if not len(pages):
            return
        steps = self.step + np.arange(len(pages)) // max(1, width)
        self.step = int(steps[-1]) + 1
        self.pages.append(pages)
        self.steps.append(steps)
        self.ops.append(np.full(len(pages), op, dtype=np.int8))

    def add_kernel(self, grid: np.ndarray, op: int = 0) -> None:
        """One kernel launch of a (steps × threads) grid: one step per row, one stream per column, stream
        ids new for this launch."""
        threads = self.next_stream + np.arange(grid.shape[1])
        self.next_stream += grid.shape[1]
        self.add(grid, width=grid.shape[1], op=op)
        self.streams.append(np.broadcast_to(threads, grid.shape).ravel())

    def trace(self, name: str, tenant: int = 0) -> Trace:
        gp = np.concatenate(self.pages)
        streams = np.concatenate(self.streams) if self.streams else None
        if streams is not None and len(streams) != len(gp):
            raise ValueError("every access of a stream trace must come from add_kernel")
        return Trace.from_columns(
            name,
            np.full(len(gp), tenant),
            gp // _P,
            gp % _P,
            np.concatenate(self.ops),
            np.concatenate(self.steps),
            streams,
        )


def _streams(start: int, npages: int, streams: int, order: np.ndarray | None = None) -> np.ndarray:
    """``streams`` threads each own a tile of ``npages // streams`` pages and take one page per step;
    row-major so consecutive entries are one step. ``order`` permutes the pages inside every tile."""
    streams = max(1, min(streams, npages))
    tile = npages // streams
    within = np.arange(tile) if order is None else order
    return start + (np.arange(streams)[None, :] * tile + within[:, None])


def _blocks(n: float) -> int:
    return max(2, round(n))


def seq_stream(seed: int = 0, scale: float = 1.0, streams: int = 64, iterations: int = 2) -> Trace:
    """uvmbench seq_stream: 64 streams scan their tiles one page per step; input and output halves."""
    b, npages = _Builder(), _blocks(128 * scale) * _P
    for _ in range(iterations):
        b.add_kernel(_streams(0, npages, streams))
    t = b.trace("seq-stream")
    return _with_ops(t, t.block >= t.blocks // 2)


def rand_stream(seed: int = 0, scale: float = 1.0, streams: int = 64, iterations: int = 2) -> Trace:
    """uvmbench rand_stream: each stream visits every page of its tile once per pass in an odd-LCG order."""
    rng = np.random.default_rng(seed)
    b, npages = _Builder(), _blocks(128 * scale) * _P
    tile = npages // streams
    for _ in range(iterations):
        step = int(rng.integers(0, tile // 2)) * 2 + 1  # odd step over a power-of-two tile: a permutation
        order = (np.arange(tile) * step + int(rng.integers(0, tile))) % tile
        b.add_kernel(_streams(0, npages, streams, order))
    return b.trace("rand-stream")


def pointer_chase(seed: int = 0, scale: float = 1.0, streams: int = 64, hops: int = 2048) -> Trace:
    """uvmbench pointer_chase: dependent random hops local to each stream's tile. ``scale`` shrinks
    the hops with the tiles, so the hops per page stay the same at every scale."""
    rng = np.random.default_rng(seed)
    b, npages = _Builder(), _blocks(128 * scale) * _P
    hops = max(16, round(hops * npages / (128 * _P)))
    tile = npages // streams
    grid = np.arange(streams)[None, :] * tile + rng.integers(0, tile, size=(hops, streams))
    b.add_kernel(grid)
    return b.trace("pointer-chase")


def hotspot(seed: int = 0, scale: float = 1.0, iterations: int = 3, row_pages: int = 16) -> Trace:
    """Rodinia hotspot: a 5-point stencil over temperature + power grids, in/out swapped per iteration."""
    per_array = _blocks(40 * scale) * _P
    rows = per_array // row_pages
    arrays = [0, per_array, 2 * per_array]  # temp A, temp B, power
    b = _Builder()
    src, dst = arrays[0], arrays[1]
    cols = np.arange(row_pages)
    for _ in range(iterations):
        for r in range(rows):
            near = [max(r - 1, 0), r, min(r + 1, rows - 1)]
            reads = np.concatenate(
                [src + q * row_pages + cols for q in near] + [arrays[2] + r * row_pages + cols]
            )
            b.add(reads, width=len(reads) + row_pages)
            b.step -= 1  # the output row is written in the same step as the reads
            b.add(dst + r * row_pages + cols, width=row_pages, op=1)
        src, dst = dst, src
    return b.trace("hotspot")


def gemm(seed: int = 0, scale: float = 1.0, tiles: int = 6, tile_pages: int = 256) -> Trace:
    """Tiled GEMM C = A·B with tile-contiguous layout: per C tile, sweep A's row and B's column of tiles."""
    tile_pages = max(16, round(tile_pages * scale))
    size = tiles * tiles * tile_pages
    a0, b0, c0 = 0, size, 2 * size
    b = _Builder()
    cols = np.arange(tile_pages)
    for i in range(tiles):
        for j in range(tiles):
            for k in range(tiles):
                pages = np.concatenate(
                    [a0 + (i * tiles + k) * tile_pages + cols, b0 + (k * tiles + j) * tile_pages + cols]
                )
                b.add(pages, width=len(pages))
            b.add(c0 + (i * tiles + j) * tile_pages + cols, width=tile_pages, op=1)
    return b.trace("gemm")


def kmeans(seed: int = 0, scale: float = 1.0, iterations: int = 3, streams: int = 32) -> Trace:
    """k-means: every iteration sweeps all points; a one-block centroid table is read every step."""
    npages = _blocks(120 * scale) * _P
    b = _Builder()
    for _ in range(iterations):
        grid = _streams(_P, npages, streams)  # points start after the centroid block
        rows = np.concatenate([grid, np.tile(np.arange(4), (grid.shape[0], 1))], axis=1)
        b.add(rows, width=rows.shape[1])
    return b.trace("kmeans")


def _layer_sweep(b: _Builder, start: int, npages: int, streams: int) -> None:
    grid = _streams(start, npages, streams)
    b.add(grid, width=grid.shape[1])


def llm_decode(
    seed: int = 0, scale: float = 1.0, layers: int = 24, layer_blocks: int = 5, tokens: int = 6
) -> Trace:
    """Dense LLM decode: every token sweeps all layers' weights in order plus the layer's KV pages
    (uvmbench DESIGN.md)."""
    layers = max(2, round(layers * scale))
    lp = layer_blocks * _P
    kv0 = layers * lp
    b = _Builder()
    for tok in range(tokens):
        for layer in range(layers):
            _layer_sweep(b, layer * lp, lp, 16)
            b.add(kv0 + layer * _P + np.arange(tok + 1), width=tok + 1)
    return b.trace("llm-decode")


def llm_moe_decode(
    seed: int = 0, scale: float = 1.0, layers: int = 8, experts: int = 32, active: int = 4, tokens: int = 24
) -> Trace:
    """MoE decode: per token and layer, the attention block plus ``active`` experts drawn with a Zipf(1.2)
    skew over a fixed per-layer popularity order (GPT-OSS-120B: 128 experts, 4 active)."""
    rng = np.random.default_rng(seed)
    layers = max(2, round(layers * scale))
    per_layer = (1 + experts) * _P
    weights = 1.0 / np.arange(1, experts + 1) ** 1.2
    weights /= weights.sum()
    popularity = [rng.permutation(experts) for _ in range(layers)]
    b = _Builder()
    for _ in range(tokens):
        for layer in range(layers):
            base = layer * per_layer
            _layer_sweep(b, base, _P, 16)
            chosen = np.sort(popularity[layer][rng.choice(experts, size=active, replace=False, p=weights)])
            for e in chosen:
                _layer_sweep(b, base + (1 + int(e)) * _P, _P, 16)
    return b.trace("llm-moe-decode")


def llm_prefill(
    seed: int = 0, scale: float = 1.0, layers: int = 24, layer_blocks: int = 5, passes: int = 5
) -> Trace:
    """LLM prefill: 5 periodic sweeps over all layers (gpu_ext WORKLOAD_ANALYSIS.md), each layer also
    reading and writing a 2-block activation buffer shared by all layers."""
    layers = max(2, round(layers * scale))
    lp = layer_blocks * _P
    act = layers * lp
    b = _Builder()
    for _ in range(passes):
        for layer in range(layers):
            _layer_sweep(b, layer * lp, lp, 32)
            b.add(act + np.arange(2 * _P), width=64, op=1)
    return b.trace("llm-prefill")


def gnn(
    seed: int = 0, scale: float = 1.0, feature_blocks: int = 32, edges: int = 10, epochs: int = 2
) -> Trace:
    """GCN chunked propagation on a random graph with 10 edges per node (the gpu_ext paper's GNN workload):
    per chunk, read its adjacency, gather the neighbours' feature pages (random), write the output chunk."""
    rng = np.random.default_rng(seed)
    nf = _blocks(feature_blocks * scale) * _P
    adj0, out0 = nf, nf + nf // 4
    b = _Builder()
    for _ in range(epochs):
        for c in range(nf // _P):
            b.add(adj0 + c * (_P // 4) + np.arange(_P // 4), width=32)
            b.add(rng.integers(0, nf, size=_P * edges), width=256)
            b.add(out0 + c * _P + np.arange(_P), width=64, op=1)
    return b.trace("gnn")


def faiss_build(seed: int = 0, scale: float = 1.0, lists: int = 4, vectors_blocks: int = 64) -> Trace:
    """FAISS IVF build: read the vectors sequentially and append each page to one of 4 inverted lists, so
    several parallel sequential streams over a widening range (gpu_ext WORKLOAD_ANALYSIS.md)."""
    rng = np.random.default_rng(seed)
    nv = _blocks(vectors_blocks * scale) * _P
    region = nv // lists + _P
    fill = np.zeros(lists, dtype=np.int64)
    b = _Builder()
    targets = rng.integers(0, lists, size=nv)
    for start in range(0, nv, 64):
        src = np.arange(start, min(start + 64, nv))
        dst = []
        for t in targets[src]:
            dst.append(nv + int(t) * region + int(fill[t]) % region)
            fill[t] += 1
        b.add(np.concatenate([src, np.array(dst)]), width=128)
    return b.trace("faiss-build")


def faiss_search(
    seed: int = 0, scale: float = 1.0, index_blocks: int = 128, queries: int = 1000, nprobe: int = 4
) -> Trace:
    """FAISS IVF search: each query scans ``nprobe`` inverted lists (64 pages each) chosen uniformly over the
    whole index; uniform random over the VA space with heavy reuse (gpu_ext WORKLOAD_ANALYSIS.md).
    ``scale`` shrinks the queries with the index, so the reuse per page stays the same at every scale."""
    rng = np.random.default_rng(seed)
    npages = _blocks(index_blocks * scale) * _P
    queries = max(16, round(queries * npages / (index_blocks * _P)))
    nlists = npages // 64
    b = _Builder()
    for _ in range(queries):
        lists = rng.choice(nlists, size=nprobe, replace=False)
        b.add((lists[:, None] * 64 + np.arange(64)[None, :]).T, width=nprobe * 16)
    return b.trace("faiss-search")


def _with_ops(t: Trace, write: np.ndarray) -> Trace:
    return Trace(t.name, t.tenant, t.block, t.page, write.astype(np.int8), t.time, t.owner, t.stream)


def mix(name: str, first: Trace, second: Trace) -> Trace:
    """Two tenants on one GPU: tenant 0 = ``first`` (high priority), tenant 1 = ``second``; their steps
    alternate in proportion to their lengths, and tenant 1's blocks come after tenant 0's. The mix is
    replayed in lockstep (streams, if any, are dropped)."""
    ta = first.time - first.time[0] if len(first) else first.time
    tb = second.time - second.time[0] if len(second) else second.time
    na, nb = max(1, int(ta[-1]) + 1), max(1, int(tb[-1]) + 1)
    # interleave by relative progress: both tenants finish at the same logical time
    key = np.concatenate([ta / na, tb / nb])
    tenant = np.concatenate([np.zeros(len(first)), np.ones(len(second))])
    order = np.lexsort((tenant, key))
    block = np.concatenate([first.block, second.block + first.blocks])
    page = np.concatenate([first.page, second.page])
    op = np.concatenate([first.op, second.op])
    sub = np.concatenate([ta, tb])
    # one step per (relative time, tenant, own step) change
    k, s, tn = key[order], sub[order], tenant[order]
    change = np.r_[True, (k[1:] != k[:-1]) | (s[1:] != s[:-1]) | (tn[1:] != tn[:-1])]
    return Trace.from_columns(
        name, tenant[order], block[order], page[order], op[order], np.cumsum(change) - 1
    )


def mix_decode_gnn(seed: int = 0, scale: float = 1.0) -> Trace:
    """The gpu_ext paper's two-tenant co-location: LLM decode (latency-critical, high) with GNN training."""
    return mix("mix-decode-gnn", llm_decode(seed, scale * 0.5), gnn(seed + 1, scale))


def mix_hotspot(seed: int = 0, scale: float = 1.0) -> Trace:
    """Two identical HotSpot tenants, high vs low priority (gpu_ext paper's memory-bound priority test)."""
    return mix("mix-hotspot", hotspot(seed, scale * 0.6), hotspot(seed + 1, scale * 0.6))


def mix_gemm(seed: int = 0, scale: float = 1.0) -> Trace:
    """Two identical GEMM tenants, high vs low priority (gpu_ext paper's memory-bound priority test)."""
    return mix("mix-gemm", gemm(seed, scale * 0.8), gemm(seed + 1, scale * 0.8))


WORKLOADS: dict[str, Callable[..., Trace]] = {
    "seq-stream": seq_stream,
    "rand-stream": rand_stream,
    "pointer-chase": pointer_chase,
    "hotspot": hotspot,
    "gemm": gemm,
    "kmeans": kmeans,
    "llm-decode": llm_decode,
    "llm-moe-decode": llm_moe_decode,
    "llm-prefill": llm_prefill,
    "gnn": gnn,
    "faiss-build": faiss_build,
    "faiss-search": faiss_search,
    "mix-decode-gnn": mix_decode_gnn,
    "mix-hotspot": mix_hotspot,
    "mix-gemm": mix_gemm,
}


def make_workload(name: str, seed: int = 0, scale: float = 1.0) -> Trace:
    """The named generator's trace; UnknownWorkload lists the known names."""
    try:
        fn = WORKLOADS[name]
    except KeyError:
        raise UnknownWorkload(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None
    return fn(seed=seed, scale=scale)


_COLUMNS = ("tenant", "block", "page", "op", "time")
_STREAM = "stream"  # optional sixth column


def write_trace_csv(trace: Trace, path: Path) -> None:
    """Write ``tenant,block,page,op,time`` (``,stream`` when the trace has streams) with a header, one row
    per access."""
    columns = [trace.tenant, trace.block, trace.page, trace.op, trace.time]
    header = list(_COLUMNS)
    if trace.stream is not None:
        columns.append(trace.stream)
        header.append(_STREAM)
    with open(path, "w", newline="") as fh:
        fh.write(",".join(header) + "\n")
        np.savetxt(fh, np.stack(columns, axis=1).astype(np.int64), fmt="%d", delimiter=",")


_MAX_FIELD = 2**31  # tenants, blocks and steps beyond this are no trace a simulation can hold


_OPS = {"r": 0, "w": 1}  # a trace's op column: r/w, or 0/1


def _csv_rows(path: Path, fh: io.StringIO) -> Iterator[list[str]]:
    """The CSV rows of ``fh``; TraceFormatError naming the row where the csv module gives up (a field
    past its 131,072-character limit, a quote left open)."""
    reader = csv.reader(fh)
    try:
        yield from reader
    except csv.Error as err:
        raise TraceFormatError(f"{path}, row {reader.line_num}: {err}") from None


def read_trace_csv(path: Path) -> Trace:
    """Read a trace CSV (header ``tenant,block,page,op,time`` and optionally ``,stream``; op is 0/1 or
    r/w); rows are sorted by time (stable). TraceFormatError names the file and the first bad row."""
    path = Path(path)
    try:
        text = read_text(path, "trace")  # binary, non-UTF-8 or empty: refused with the file's name
    except InvalidInput as err:
        raise TraceFormatError(str(err)) from None
    with io.StringIO(text, newline="") as fh:
        reader = _csv_rows(path, fh)
        header = [h.strip() for h in next(reader, [])]
        if header not in (list(_COLUMNS), [*_COLUMNS, _STREAM]):
            raise TraceFormatError(
                f"{path}: header must be {','.join(_COLUMNS)}[,{_STREAM}], got {','.join(header)}"
            )
        width = len(header)
        cols: list[list[int]] = [[] for _ in header]
        for row_no, row in enumerate(reader, start=2):
            try:
                if len(row) != width:
                    raise ValueError
                opv = row[3].strip().lower()
                values = [
                    int(row[0]),
                    int(row[1]),
                    int(row[2]),
                    _OPS[opv] if opv in _OPS else int(opv),
                    int(float(row[4])),
                    *(int(v) for v in row[5:]),
                ]
            except (ValueError, OverflowError):  # OverflowError: a time of inf or 1e400
                raise TraceFormatError(
                    f"{path}, row {row_no}: expected {width} integers, got {','.join(row)[:200]}"
                ) from None
            if not all(0 <= v < _MAX_FIELD for v in values):  # the int64 columns must hold them
                raise TraceFormatError(
                    f"{path}, row {row_no}: each field must be from 0 to {_MAX_FIELD - 1:,}, "
                    f"got {','.join(row)[:200]}"
                )
            for c, v in zip(cols, values, strict=True):
                c.append(v)
    if not cols[0]:
        raise TraceFormatError(f"{path}: the trace has a header and no accesses; give at least one row")
    arrays = [np.asarray(c, dtype=np.int64) for c in cols]
    order = np.argsort(arrays[4], kind="stable")
    return Trace.from_columns(path.stem, *(a[order] for a in arrays))
