#!/usr/bin/env python3
"""`ember serve` of an HSTU model on a device, checked against `ember predict` on the CPU in f32.

    python3 bench/gpu/hstu_serve_check.py --ember .gpu/ember --model DIR --users FILE.jsonl \
        [--device cuda] [--dense-dtype bf16] [--tol 0.03] [--instances 2] [--label NAME]
        [--serve-args '--history-cache-mb 4096']

It starts `ember serve --model DIR --device D` (HTTP on a loopback port of its own choosing, read
from its log line) and checks, over `/v1/score`:
  1. each user of FILE alone: every task's scores within --tol (absolute, and relative to the
     score) of the CPU's f32 `ember predict` on the same file;
  2. all users in one request (one batch on the device): the same scores as alone (--tol);
  3. 8 client threads sending every user 3 times each, concurrently (batches of users from
     several requests): the same scores again;
  4. a user with no features answered 400 naming `user 0`, and the server still scores after it;
  5. `/metrics` has the per-user latency histogram, and the start-up line names the device; with
     `--serve-args '--history-cache-mb N'`, users sent again were scored from their entries (hits).
Prints one line per check and `hstu serve check: PASS` or `FAIL (n checks)`; exit status 0 only
on PASS. With --device cpu it checks the CPU server the same way (the script's own test, here).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

START_SECS = 180.0
CALL_SECS = 60.0


def post(addr, path, body):
    req = urllib.request.Request(f"http://{addr}{path}", data=body.encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=CALL_SECS) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def get(addr, path):
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=CALL_SECS) as r:
        return r.read().decode()


def start(args):
    """The server, its HTTP address and the lines it logged before it; None where it did not start."""
    cmd = [args.ember, "serve", "--model", args.model, "--device", args.device, "--http",
           "127.0.0.1:0", "--grpc", "off", "--instances", str(args.instances), "--max-batch",
           str(args.max_batch), "--max-queue-delay-ms", "0"]
    if args.dense_dtype:
        cmd += ["--dense-dtype", args.dense_dtype]
    if args.device == "cuda":
        cmd += ["--gpu-variant", args.gpu_variant]
    cmd += args.serve_args.split()
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines, addr = [], None
    found = threading.Event()
    banner = threading.Event()

    def read():
        nonlocal addr
        for line in p.stderr:
            lines.append(line.rstrip())
            if addr is None and " on http://" in line:
                addr = line.split(" on http://")[1].split()[0]
                found.set()
            if "model '" in line and " device " in line:
                banner.set()
        found.set()
        banner.set()

    threading.Thread(target=read, daemon=True).start()
    found.wait(START_SECS)
    if addr is None:
        p.kill()
        p.wait()
        return None, None, lines
    # The line naming the device may come after the address's.
    banner.wait(START_SECS)
    return p, addr, lines


def close(want, got, tol):
    """The first task / place where `got` is off `want` by more than tol (abs + rel), else None."""
    for task, ws in want.items():
        gs = got.get(task)
        if gs is None or len(gs) != len(ws):
            return f"{task}: {None if gs is None else len(gs)} scores for {len(ws)}"
        for k, (w, g) in enumerate(zip(ws, gs)):
            if abs(g - w) > tol * (1.0 + abs(w)):
                return f"{task}[{k}]: {g} against {w}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ember", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--users", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dense-dtype", default=None, choices=["f32", "bf16"])
    ap.add_argument("--gpu-variant", default="tuned")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--label", default=None)
    ap.add_argument("--serve-args", default="",
                    help="more flags for `ember serve` (e.g. '--history-cache-mb 4096': a user sent again "
                         "with the same history is scored from its entry, as the full recompute to rounding)")
    args = ap.parse_args()
    label = args.label or os.path.basename(os.path.normpath(args.model))
    fails = []

    def check(ok, what):
        print(f"  {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            fails.append(what)

    lines = [l for l in open(args.users) if l.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cpu.jsonl")
        r = subprocess.run([args.ember, "predict", "--model", args.model, "--data", args.users,
                            "--out", out], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            print(r.stderr[-2000:])
            sys.exit(f"{label}: ember predict on the CPU failed")
        want = [json.loads(l)["scores"] for l in open(out) if l.strip()]
    assert len(want) == len(lines), (len(want), len(lines))
    print(f"{label}: {len(lines)} users, device {args.device}, dense {args.dense_dtype or 'as the model says'}, "
          f"tol {args.tol}", flush=True)

    t0 = time.time()
    p, addr, log = start(args)
    if p is None:
        print("\n".join(log[-20:]))
        print(f"hstu serve check ({label}): FAIL (the server did not start in {START_SECS:.0f} s)")
        sys.exit(1)
    print(f"  server up in {time.time() - t0:.1f} s on {addr}", flush=True)
    try:
        banner = [l for l in log if "device " in l and "model '" in l]
        print("  " + (banner[0] if banner else "(no banner line)"), flush=True)
        check(any(f"device {args.device}" in l for l in banner), f"the start-up line names device {args.device}")

        # 1. Each user alone.
        worst = None
        for k, (l, w) in enumerate(zip(lines, want)):
            status, body = post(addr, "/v1/score", l)
            if status != 200:
                worst = f"user {k}: HTTP {status}: {body[:300]}"
                break
            off = close(w, json.loads(body)["scores"][0], args.tol)
            if off:
                worst = f"user {k}: {off}"
                break
        check(worst is None, f"each user alone against the CPU's f32 {'' if worst is None else worst}")

        # 2. All users in one request.
        status, body = post(addr, "/v1/score", "[" + ",".join(l.strip() for l in lines) + "]")
        bad = None
        if status != 200:
            bad = f"HTTP {status}: {body[:300]}"
        else:
            got = json.loads(body)["scores"]
            bad = next((f"user {k}: {o}" for k, (w, g) in enumerate(zip(want, got))
                        if (o := close(w, g, args.tol))), None) if len(got) == len(want) else \
                f"{len(got)} users answered of {len(want)}"
        check(bad is None, f"all users in one request {'' if bad is None else bad}")

        # 3. Concurrent requests, batched together on the server.
        errors = []

        def client(seed):
            for r in range(3):
                for k in range(len(lines)):
                    k2 = (k + seed + r) % len(lines)
                    status, body = post(addr, "/v1/score", lines[k2])
                    o = f"HTTP {status}" if status != 200 else close(want[k2], json.loads(body)["scores"][0], args.tol)
                    if o:
                        errors.append(f"user {k2}: {o}")
                        return

        threads = [threading.Thread(target=client, args=(s,)) for s in range(8)]
        t1 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        took = time.time() - t1
        check(not errors and not any(t.is_alive() for t in threads),
              f"8 clients x 3 x {len(lines)} users concurrently in {took:.1f} s {errors[:1]}")

        # 4. A bad user, then a good one.
        status, body = post(addr, "/v1/score", '{"uih": {}, "candidates": {}}')
        check(status == 400 and "user 0" in body, f"a user with no features: HTTP {status} {body[:200]}")
        status, _ = post(addr, "/v1/score", lines[0])
        check(status == 200, f"scores after it: HTTP {status}")

        # 5. Metrics.
        m = get(addr, "/metrics")
        check("ember_user_request_duration_seconds_bucket" in m, "/metrics has the per-user latency histogram")
        if "--history-cache-mb" in args.serve_args:
            hits = sum(float(l.split()[-1]) for l in m.splitlines()
                       if l.startswith("ember_history_cache_hits_total"))
            check(hits >= len(lines), f"users sent again were scored from their entries: {hits:.0f} hits")
    finally:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
    verdict = "PASS" if not fails else f"FAIL ({len(fails)} checks)"
    print(f"hstu serve check ({label}): {verdict}", flush=True)
    sys.exit(0 if not fails else 1)


if __name__ == "__main__":
    main()
