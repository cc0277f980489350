#!/usr/bin/env python3
"""Checks `ember predict` against PyTorch on fresh synthetic Criteo rows: AUC and scores.

    ~/.venvs/torch/bin/python tools/check_auc.py                       # models/default, 100000 rows
    ~/.venvs/torch/bin/python tools/check_auc.py --model DIR --rows 20000 --seed 7

`ember data synth` writes the rows (a seed not used in training), `ember predict` scores them
(one score per line, in row order), and the PyTorch reference built from the same model
directory (tools/dlrm_ref.py's load_ember_model, rows read by its read_criteo) scores them too.
Prints both AUCs (scikit-learn), their difference and the largest score difference; exits 1 if
|AUC difference| exceeds --max-auc-diff (default 0.002).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dlrm_ref import auc_logloss, load_ember_model, read_criteo  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"check_auc.py: `{' '.join(cmd)}` failed:\n{proc.stderr}{proc.stdout}")


def torch_scores(model_dir, data, batch=8192):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    rows = {t["name"]: t["rows"] for t in cfg["tables"]}
    feats = cfg.get("features") or [{"table": t["name"]} for t in cfg["tables"]]
    if cfg["dense_in"] != 13 or len(feats) != 26:
        sys.exit(f"check_auc.py: {model_dir} has dense_in {cfg['dense_in']} and {len(feats)} features; "
                 "Criteo data needs 13 and 26")
    dense, ids, labels = read_criteo(data, [rows[f["table"]] for f in feats])
    model = load_ember_model(model_dir)
    out = []
    with torch.inference_mode():
        for s in range(0, len(labels), batch):
            d = torch.from_numpy(dense[s:s + batch])
            i = torch.from_numpy(np.ascontiguousarray(ids[s:s + batch].T)).reshape(-1)
            out.append(torch.sigmoid(model(d, torch.ones(26, len(d), dtype=torch.long), i)))
    return labels, torch.cat(out).numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ember", default=os.path.join(ROOT, "target", "release", "ember"), help="ember binary")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "default"), help="model directory")
    ap.add_argument("--rows", type=int, default=100_000, help="rows to score (default 100000)")
    ap.add_argument("--seed", type=int, default=1234, help="`ember data synth` seed (default 1234)")
    ap.add_argument("--max-auc-diff", type=float, default=0.002, help="fail above this |AUC difference|")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data, scores = os.path.join(tmp, "rows.tsv"), os.path.join(tmp, "scores.txt")
        run([a.ember, "data", "synth", "--rows", str(a.rows), "--seed", str(a.seed), "--out", data])
        run([a.ember, "predict", "--model", a.model, "--data", data, "--out", scores])
        ember = np.loadtxt(scores, dtype=np.float64, ndmin=1)
        labels, ref = torch_scores(a.model, data)
    if len(ember) != len(labels):
        sys.exit(f"check_auc.py: ember predict wrote {len(ember)} scores for {len(labels)} rows")
    e_auc, e_ll = auc_logloss(labels, ember)
    t_auc, t_ll = auc_logloss(labels, ref)
    diff = np.abs(ember - ref)
    print(f"{len(labels)} rows (seed {a.seed}, {labels.mean():.3f} positive), model {a.model}")
    print(f"  ember   AUC {e_auc:.6f}  log loss {e_ll:.6f}")
    print(f"  pytorch AUC {t_auc:.6f}  log loss {t_ll:.6f}")
    print(f"  AUC difference {e_auc - t_auc:+.2e}; score difference max {diff.max():.2e}, mean {diff.mean():.2e} "
          f"(row {int(diff.argmax()) + 1})")
    if abs(e_auc - t_auc) > a.max_auc_diff:
        sys.exit(f"check_auc.py: FAILED: |AUC difference| {abs(e_auc - t_auc):.2e} > {a.max_auc_diff}")
    print("OK")


if __name__ == "__main__":
    main()
