"""``igsim collective``: predict the time of one collective, nccl-tests style.

    igsim collective --algorithm ring --ranks 64 --size 100MB --bandwidth 100Gbps --latency 5us
    igsim collective --op sparse_all_gather --ranks 4 --sizes 1MB,2MB,1MB,3MB --bandwidth 10Gbps
    igsim collective --topology igsim/data/two_level.json --algorithm hierarchical --size 1GiB --json

Without ``--topology`` the cluster is a star whose rank-to-rank latency is ``--latency`` (each of
the two links carries half) and whose links run at ``--bandwidth``. Reports ``time_s``,
``algbw_bytes_per_s`` = n / t and ``busbw_bytes_per_s`` = algbw x the nccl-tests factor
(2(p-1)/p all-reduce, (p-1)/p all-gather, reduce-scatter and sparse all-gather, 1 broadcast); for
the sparse all-gather n is the sum of the payloads.
"""

from __future__ import annotations

import argparse
import json

from igpolicy.cli_util import reading
from igpolicy.limits import check_count
from igpolicy.units import (
    format_bandwidth,
    format_bytes,
    format_time,
    parse_bandwidth,
    parse_size,
    parse_time,
)
from igsim.collectives.predict import ALGORITHMS, MODES, OPS, CollectiveSpec, predict_collective
from igsim.net.calibration import Calibration
from igsim.net.topology import load_topology, star


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--op", choices=OPS, default="all_reduce", help="the collective (default all_reduce)")
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="ring", help="its algorithm (default ring)")
    parser.add_argument(
        "--ranks", type=int, help="number of ranks (star); checked against --topology if both"
    )
    parser.add_argument("--size", help="bytes per rank, e.g. 100MB, 1GiB (dense ops and broadcast)")
    parser.add_argument(
        "--sizes", help="comma-separated payload per rank for sparse_all_gather, e.g. 1MB,2MB"
    )
    parser.add_argument("--bandwidth", help="link rate of the star with a unit, e.g. 100Gbps, 12.5GB/s")
    parser.add_argument("--latency", default="0s", help="rank-to-rank latency of the star with a unit, e.g. 5us (default 0s)")
    parser.add_argument("--topology", help="a topology file (JSON or YAML) instead of the star")
    parser.add_argument("--calibration", help="a calibration JSON file (alpha, effective bandwidth, gamma)")
    parser.add_argument("--chunks", type=int, default=1, help="pipelining chunks (tree, ring broadcast)")
    parser.add_argument("--root", type=int, default=0, help="broadcast root rank")
    parser.add_argument("--mode", choices=MODES, default="auto", help="costing: flow simulation, closed form or auto (default)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


_BUS_FACTOR = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "sparse_all_gather": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
}


def run(args: argparse.Namespace) -> int:
    if args.topology:
        with reading(args.topology, "--topology"):
            topo = load_topology(args.topology)
        if args.ranks is not None and args.ranks != topo.num_ranks:
            raise ValueError(f"--ranks {args.ranks} but {args.topology} has {topo.num_ranks} ranks")
    else:
        if args.ranks is None or args.bandwidth is None:
            raise ValueError("give --ranks and --bandwidth (a star), or --topology FILE")
        check_count(args.ranks, what="--ranks", limit="MAX_RANKS")
        latency_s = parse_time(args.latency, flag="--latency")
        topo = star(
            num_ranks=args.ranks,
            bandwidth_bytes_per_s=parse_bandwidth(args.bandwidth, flag="--bandwidth"),
            latency_s=latency_s / 2,
        )
    p = topo.num_ranks
    sizes: tuple[int, ...] = ()
    if args.op == "sparse_all_gather":
        if not args.sizes:
            raise ValueError("--op sparse_all_gather needs --sizes (one payload per rank, comma-separated)")
        sizes = tuple(parse_size(s.strip(), flag="--sizes") for s in args.sizes.split(","))
        if len(sizes) != p:
            raise ValueError(f"--sizes lists {len(sizes)} payloads for {p} ranks")
        n = float(sum(sizes))
    else:
        if args.size is None:
            raise ValueError(f"--op {args.op} needs --size (bytes per rank, e.g. 100MB)")
        n = float(parse_size(args.size, flag="--size"))
    calibration = None
    if args.calibration:
        with reading(args.calibration, "--calibration"):
            calibration = Calibration.load(args.calibration)
    spec = CollectiveSpec(op=args.op, algorithm=args.algorithm, size_bytes=0.0 if sizes else n, sizes_bytes=sizes,
                          num_chunks=args.chunks, root=args.root)  # fmt: skip
    result = predict_collective(spec, topo, calibration=calibration, mode=args.mode)
    t = result.time_s
    algbw = n / t if t > 0 else float("inf")
    busbw = algbw * _BUS_FACTOR[args.op](p)
    out = {
        "op": args.op,
        "algorithm": args.algorithm,
        "topology": topo.name,
        "num_ranks": p,
        "size_bytes": n,
        "mode": args.mode,
        "time_s": t,
        "algbw_bytes_per_s": algbw,
        "busbw_bytes_per_s": busbw,
        "max_bytes_sent_per_rank": max(result.bytes_sent_per_rank),
        "num_messages": result.num_messages,
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{args.op} / {args.algorithm} on {topo.name} ({p} ranks), {format_bytes(n)}, mode {args.mode}")
    print(f"  time           {format_time(t)}")
    print(f"  algbw          {format_bandwidth(algbw)}")
    print(f"  busbw          {format_bandwidth(busbw)}")
    print(f"  sent per rank  {format_bytes(out['max_bytes_sent_per_rank'])} (max)")
    print(f"  messages       {result.num_messages}")
    return 0
