"""How fast the DeepMark iterator produces data, in seconds of audio per second.

    python benchmarks/data_throughput.py [--batch-size 32] [--scale 1280] [--repeats 3]

The spec asks for data at least 50x faster than the fastest GPU consumes it.  A GPU cannot train
faster than its peak arithmetic allows: DS2 training costs ~14.5 GFLOP per second of audio
(common.spec), so an H100/H200 at its dense bf16 peak (~989 TFLOP/s) would consume at most
~68,000 s of audio per second.  This script measures the iterator against that bound and, when
result records from GPU runs exist in results/records, against the fastest one measured.
"""
import glob
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from common.data import DeepMarkIterator  # noqa: E402
from common.spec import FULL_MODEL  # noqa: E402
from runner.validate import OneLineParser, positive_int  # noqa: E402  (standard library only)

HOPPER_BF16_DENSE_FLOPS = 989e12


def measure(batch_size, scale, repeats, materialize):
    it = DeepMarkIterator(batch_size, scale, seed=0)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in it:
            if materialize:   # what a consumer that needs its own writable copy would pay
                np.array(batch.features)
        best = min(best, time.perf_counter() - start)
    return it.audio_seconds / best, it


def fastest_gpu_record():
    best = None
    for path in glob.glob(os.path.join(ROOT, "results", "records", "*.json")):
        with open(path) as f:
            rec = json.load(f)
        speed = (rec.get("timing") or {}).get("audio_s_per_s")
        if rec.get("status") == "ok" and rec.get("device", {}).get("type") == "cuda" and speed:
            if best is None or speed > best[0]:
                best = (speed, "%s %s on %s" % (rec["target"], rec["precision"], rec["device"].get("name")))
    return best


def main(argv=None):
    p = OneLineParser(prog="data_throughput.py", description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=positive_int, default=32, metavar="N", help="at least 1 (default 32)")
    p.add_argument("--scale", type=positive_int, default=1280, metavar="N", help="at least 1 (default 1280)")
    p.add_argument("--repeats", type=positive_int, default=3, metavar="N", help="at least 1 (default 3)")
    args = p.parse_args(argv)

    start = time.perf_counter()
    DeepMarkIterator(args.batch_size, args.scale, seed=0)
    setup_s = time.perf_counter() - start
    views, it = measure(args.batch_size, args.scale, args.repeats, materialize=False)
    copies, _ = measure(args.batch_size, args.scale, 1, materialize=True)
    bound = HOPPER_BF16_DENSE_FLOPS / FULL_MODEL.train_flops_per_audio_second
    print("DeepMark iterator, batch size %d, scale %d: %d batches, %.1f h of audio" % (
        args.batch_size, args.scale, len(it), it.audio_hours))
    print("  set-up (feature pool drawn and hashed once): %.2f s" % setup_s)
    print("  pass yielding batches (read-only views of the pool): %12.0f s of audio per second" % views)
    print("  pass copying every batch (np.array of the features): %12.0f s of audio per second" % copies)
    print("  upper bound of any GPU at 989 TFLOP/s bf16 dense:     %12.0f s of audio per second" % bound)
    print("  -> iterator / bound: %.0fx (views), %.0fx (copies); the spec asks for >= 50x" % (
        views / bound, copies / bound))
    fastest = fastest_gpu_record()
    if fastest:
        print("  fastest GPU run recorded: %.0f s of audio per second (%s) -> %.0fx" % (
            fastest[0], fastest[1], views / fastest[0]))
    else:
        print("  no GPU result records in results/records yet")


if __name__ == "__main__":
    main()
