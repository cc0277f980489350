"""The timing loop the graph benchmarks share (compare_onnx.py, compare_torch_graph.py,
onnx_whole.py): one warm-up call, one timed call to size the loop to about `budget` seconds
(at most `cap` calls), then the loop; milliseconds per call."""

import time


def ms_per_call(fn, budget=0.3, cap=1000):
    fn()
    t = time.perf_counter()
    fn()
    iters = max(1, min(cap, int(budget / max(time.perf_counter() - t, 1e-6))))
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) * 1e3 / iters
