#!/usr/bin/env python3
"""The PyTorch peer of `ember serve --preset rm1`: the simplest honest HTTP server for the same
model, for `ember loadgen` to measure side by side.

The identical architecture as bench/compare_torch_dlrm.py (facebookresearch/dlrm's DLRM_Net:
one nn.EmbeddingBag per table, random weights) behind Python's http.server
(ThreadingHTTPServer, HTTP/1.1 keep-alive), speaking the subset of the KServe v2 protocol that
`ember loadgen --format kserve` uses: `GET /v2/models/{name}` (metadata, with each table's rows
as `parameters.rows` of its `_ids` input) and `POST /v2/models/{name}/infer` (`dense` FP32
[N, 2048], `tF_lengths` / `tF_ids` INT64 per table). Each request runs its own forward under
`torch.inference_mode()` (no batching across requests: the simplest server a PyTorch user
would write).

    ~/.venvs/torch/bin/python bench/torch_serve_dlrm.py --port 8090 --threads 1 &
    target/release/ember loadgen --url http://127.0.0.1:8090 --model rm1 --pooling 80 \\
        --find-max --slo-p99-ms 10 --qps 100 --duration 5
"""

import argparse
import json
import os
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_torch_dlrm import PRESETS, build_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="rm1", choices=sorted(PRESETS))
    ap.add_argument("--port", type=int, default=8090)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    p = PRESETS[a.preset]
    model = build_model(p)
    names = [f"t{i}" for i in range(p["tables"])]
    dense_in = p["bottom"][0]
    inputs = [{"name": "dense", "datatype": "FP32", "shape": [-1, dense_in]}]
    for n in names:
        inputs.append({"name": f"{n}_lengths", "datatype": "INT64", "shape": [-1]})
        inputs.append({"name": f"{n}_ids", "datatype": "INT64", "shape": [-1], "parameters": {"rows": p["rows"]}})
    meta = json.dumps({"name": a.preset, "versions": ["1"], "platform": "pytorch", "inputs": inputs,
                       "outputs": [{"name": "scores", "datatype": "FP32", "shape": [-1]}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def setup(self):
            super().setup()
            # Headers and body go out in two writes: without this, Nagle's algorithm and the
            # client's delayed ACK hold the body back ~40 ms.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def reply(self, code, body):
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == f"/v2/models/{a.preset}":
                self.reply(200, meta)
            else:
                self.reply(404, b'{"error": "not found"}')

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != f"/v2/models/{a.preset}/infer":
                self.reply(404, b'{"error": "not found"}')
                return
            try:
                req = json.loads(body)
                byname = {i["name"]: i for i in req["inputs"]}
                d = byname["dense"]
                dense = torch.tensor(d["data"], dtype=torch.float32).reshape(d["shape"])
                offs, ids = [], []
                for n in names:
                    lengths = torch.tensor(byname[f"{n}_lengths"]["data"], dtype=torch.int64)
                    offs.append(torch.cumsum(lengths, 0) - lengths)
                    ids.append(torch.tensor(byname[f"{n}_ids"]["data"], dtype=torch.int64))
                with torch.inference_mode():
                    scores = model(dense, offs, ids).reshape(-1).tolist()
            except (KeyError, ValueError, RuntimeError, TypeError) as e:
                self.reply(400, json.dumps({"error": str(e)}).encode())
                return
            out = {"model_name": a.preset, "model_version": "1",
                   "outputs": [{"name": "scores", "datatype": "FP32", "shape": [len(scores)], "data": scores}]}
            self.reply(200, json.dumps(out).encode())

    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    print(f"serving PyTorch {a.preset} on http://127.0.0.1:{a.port}", file=sys.stderr, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
