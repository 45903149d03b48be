"""Flags more than one ``igrt`` command shares, and what they mean (one definition each).

The workload flags of ``igrt train`` and ``igrt record``: a reference workload, or your own local
Hugging Face checkpoint on your own data file, and the learning-rate schedule.

    --workload minilm | gpt | hf        (hf is the default with --model)
    --model DIR --data FILE [--tokenizer DIR] [--text-column C] [--label-column C] [--seq-len N]
    [--heldout-fraction F] [--lr LR] [--schedule constant|cosine] [--warmup-steps N]

The reference workloads are named presets of the same code path (:func:`igrt.workloads.make_workload`
with a :class:`igrt.workloads.WorkloadSpec`); docs/runtime.md documents the data formats.

The link flags of ``igrt testbed`` and ``igrt validate`` (``--bandwidth``, ``--two-level``,
``--uplink-bandwidth``, ``--hetero``, ``--slow-bandwidth``) and the testbed they describe.
"""

from __future__ import annotations

import argparse

from igpolicy.cli_util import add_deprecated_alias
from igpolicy.units import parse_bandwidth
from igrt.testbed import namespaces as testbed
from igrt.workloads import ALL_WORKLOADS, HF_WORKLOAD
from igrt.workloads.schedule import SCHEDULES

__all__ = ["add_testbed_arguments", "add_workload_arguments", "spec_command_line", "spec_from_args", "workload_spec"]


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """Add the shared workload flags to ``p``."""
    p.add_argument(
        "--workload",
        choices=ALL_WORKLOADS,
        default=None,
        help="reference workload (minilm, gpt), or hf: your own --model on your own --data (the default with --model)",
    )
    own = p.add_argument_group("your own model and data (--workload hf; docs/runtime.md)")
    own.add_argument("--model", default=None, metavar="DIR", help="local Hugging Face checkpoint (causal LM or classifier)")
    own.add_argument("--tokenizer", default=None, metavar="DIR", help="tokenizer directory (default: --model)")
    own.add_argument("--data", default=None, metavar="FILE", help="training data: .jsonl, .csv or .txt (one example per line)")
    own.add_argument("--text-column", default="text", help="JSONL / CSV column holding the text (default text)")
    own.add_argument(
        "--label-column", default=None, help="JSONL / CSV column holding the label: sequence classification"
    )
    own.add_argument("--seq-len", type=int, default=None, help="tokens per example (default min(128, model's))")
    own.add_argument(
        "--heldout-fraction", type=float, default=0.1, help="share of examples held out for evaluation (default 0.1)"
    )
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the workload's own)")
    p.add_argument("--schedule", choices=SCHEDULES, default="constant", help="learning-rate schedule (default constant)")
    p.add_argument("--warmup-steps", type=int, default=0, help="linear learning-rate warm-up steps (default 0)")


def workload_spec(args: argparse.Namespace):
    """(workload name, WorkloadSpec) from the arguments; ValueError for a bad combination."""
    from igrt.workloads import WorkloadSpec

    name = args.workload or (HF_WORKLOAD if args.model else None)
    if name is None:
        raise ValueError("give --workload (minilm, gpt) or your own --model DIR --data FILE")
    if name == HF_WORKLOAD and args.tiny:
        raise ValueError("--tiny is for the reference workloads; with --model your checkpoint is the model")
    spec = WorkloadSpec(
        model=args.model,
        tokenizer=args.tokenizer,
        data=args.data,
        text_column=args.text_column,
        label_column=args.label_column,
        seq_len=args.seq_len,
        heldout_fraction=args.heldout_fraction,
        lr=args.lr,
        schedule=args.schedule,
        warmup_steps=args.warmup_steps,
        total_steps=args.steps,
    )
    return name, spec


def spec_command_line(args: argparse.Namespace) -> list[str]:
    """The workload flags that reproduce ``args`` (only those that differ from their defaults)."""
    import shlex

    parts = [f"--workload {args.workload}"] if args.workload else []
    for flag, value, default in (
        ("--model", args.model, None),
        ("--tokenizer", args.tokenizer, None),
        ("--data", args.data, None),
        ("--text-column", args.text_column, "text"),
        ("--label-column", args.label_column, None),
        ("--seq-len", args.seq_len, None),
        ("--heldout-fraction", args.heldout_fraction, 0.1),
        ("--lr", args.lr, None),
        ("--schedule", args.schedule, "constant"),
        ("--warmup-steps", args.warmup_steps, 0),
    ):
        if value is not None and value != default:
            parts.append(f"{flag} {shlex.quote(str(value))}")
    return parts


def add_testbed_arguments(p: argparse.ArgumentParser) -> None:
    """The link flags ``igrt testbed`` and ``igrt validate`` share (``--ranks`` is each command's own)."""
    rate = p.add_argument(
        "--bandwidth",
        dest="rate",
        metavar="RATE",
        default="100Mbit",
        help="per-rank link rate with a unit, both directions, e.g. 100Mbit, 1Gbit/s (default 100Mbit)",
    )
    p.add_argument("--two-level", action="store_true", help="two bridges joined by one slower shaped uplink")
    uplink = p.add_argument(
        "--uplink-bandwidth",
        dest="uplink_rate",
        metavar="RATE",
        default=None,
        help="inter-bridge rate with --two-level, with a unit (default: --bandwidth / 2)",
    )
    p.add_argument("--hetero", action="store_true", help="give the last rank a slower NIC")
    slow = p.add_argument(
        "--slow-bandwidth",
        dest="slow_rate",
        metavar="RATE",
        default=None,
        help="rate of the slow NIC with --hetero, with a unit (default: --bandwidth / 4)",
    )
    p.add_argument("--ring", action="store_true", help="3 ranks on a switchless ring: one shaped link per pair")
    p.add_argument(
        "--queue-ms",
        type=float,
        default=testbed.DEFAULT_QUEUE_S * 1e3,
        metavar="MS",
        help=f"every shaper's queue limit, ms of traffic (default {testbed.DEFAULT_QUEUE_S * 1e3:g})",
    )
    p.add_argument(
        "--queue-min-bytes",
        type=int,
        default=testbed.DEFAULT_QUEUE_MIN_BYTES,
        metavar="BYTES",
        help="a shaper's queue holds at least this many bytes: on a link slower than BYTES per --queue-ms "
        f"its queue is longer in time (default {testbed.DEFAULT_QUEUE_MIN_BYTES}, what 10 ms holds at "
        "100 Mbit/s; 0: --queue-ms on every link)",
    )
    p.add_argument(
        "--host-queue-bytes",
        type=int,
        default=testbed.DEFAULT_HOST_QUEUE_BYTES,
        metavar="BYTES",
        help="the queue of a rank's own egress shapers (its NIC), bytes (default "
        f"{testbed.DEFAULT_HOST_QUEUE_BYTES}: TCP's own backpressure limits it, as on a real host; 0: "
        "like every other shaper, the testbed before 2026-12-07)",
    )
    p.add_argument(
        "--tcp-slow-start-after-idle",
        type=int,
        choices=(0, 1),
        default=1,
        help="the rank namespaces' net.ipv4.tcp_slow_start_after_idle (default 1, Linux's; 0: an idle "
        "connection keeps its congestion window)",
    )
    for old, new in (("--rate", rate), ("--uplink-rate", uplink), ("--slow-rate", slow)):
        add_deprecated_alias(p, old, new)


def spec_from_args(args: argparse.Namespace) -> testbed.TestbedSpec:
    """The testbed the link flags describe (``--run-id``, where the command has one, names it)."""
    rate = parse_bandwidth(args.rate, flag="--bandwidth")
    ids = {"run_id": args.run_id} if getattr(args, "run_id", None) else {}
    uplink = parse_bandwidth(args.uplink_rate, flag="--uplink-bandwidth") if args.uplink_rate else rate / 2
    slow = parse_bandwidth(args.slow_rate, flag="--slow-bandwidth") if args.slow_rate else rate / 4
    return testbed.TestbedSpec(
        **ids,
        num_ranks=args.ranks,
        rate_bytes_per_s=rate,
        two_level=args.two_level,
        uplink_rate_bytes_per_s=uplink if args.two_level else None,
        slow_rank=args.ranks - 1 if args.hetero else None,
        slow_rate_bytes_per_s=slow if args.hetero else None,
        ring=args.ring,
        queue_s=args.queue_ms / 1e3,
        queue_min_bytes=args.queue_min_bytes,
        host_queue_bytes=args.host_queue_bytes,
        slow_start_after_idle=bool(args.tcp_slow_start_after_idle),
    )
