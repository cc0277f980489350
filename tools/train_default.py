#!/usr/bin/env python3
"""Trains the shipped default model, models/default/, and writes data/sample.tsv.

    ~/.venvs/torch/bin/python tools/train_default.py          # about 2-5 minutes on 2 CPU cores

Steps: `ember data synth` writes Criteo-format TSV whose labels come from a hidden teacher
(train and validation rows from different seeds); tools/dlrm_ref.py's read_criteo reads it as
docs/model-format.md says (ids hashed `int(hex, 16) % rows` per table); a facebookresearch/dlrm
DLRM_Net (DLRMNet) is trained on CPU: dense 13 -> bottom 13-64-16, 26 tables x 2048 rows x
dim 16, dot interaction, top 367-128-64-1, Adam with L2 1e-4 (without it the tables overfit
after one epoch), BCE on the logits; the epoch with the best validation AUC is kept. It prints
train and validation AUC and log loss, saves a dlrm-style checkpoint, converts it with
tools/export_torch.py, checks that the exported model reproduces the trained one, writes
models/default/README.md, and finally `ember data synth`s a fresh data/sample.tsv.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dlrm_ref import DLRMNet, auc_logloss, load_ember_model, read_criteo  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIM, BOTTOM, TOP = 16, [13, 64, 16], [128, 64, 1]


def synth(ember, rows, seed, out, shown=None):
    """Runs `ember data synth`; returns the command as the README shows it."""
    cmd = [ember, "data", "synth", "--rows", str(rows), "--seed", str(seed), "--out", out]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"train_default.py: `{' '.join(cmd)}` failed:\n{proc.stderr}{proc.stdout}")
    return f"data synth --rows {rows} --seed {seed} --out {shown or os.path.basename(out)}"


def predict(model, dense, ids, batch=8192):
    """DLRMNet scores for Criteo rows (one id per feature)."""
    out = []
    with torch.inference_mode():
        for s in range(0, len(dense), batch):
            d, i = torch.from_numpy(dense[s:s + batch]), torch.from_numpy(ids[s:s + batch])
            offs = [torch.arange(len(d))] * i.shape[1]
            out.append(model(d, offs, list(i.T.contiguous()))[:, 0])
    return torch.cat(out).numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ember", default=os.path.join(ROOT, "target", "release", "ember"), help="ember binary")
    ap.add_argument("--rows", type=int, default=400_000, help="training rows (default 400000)")
    ap.add_argument("--val-rows", type=int, default=100_000, help="validation rows (default 100000)")
    ap.add_argument("--seed", type=int, default=1, help="`ember data synth` seed of the training rows (default 1)")
    ap.add_argument("--val-seed", type=int, default=2, help="seed of the validation rows (default 2)")
    ap.add_argument("--sample-seed", type=int, default=3, help="seed of data/sample.tsv (default 3)")
    ap.add_argument("--sample-rows", type=int, default=2000, help="rows of data/sample.tsv (default 2000)")
    ap.add_argument("--table-rows", type=int, default=2048, help="rows per table (default 2048)")
    ap.add_argument("--epochs", type=int, default=3, help="default 3")
    ap.add_argument("--batch", type=int, default=512, help="default 512")
    ap.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate (default 2e-3)")
    ap.add_argument("--weight-decay", type=float, default=1e-4, help="Adam L2 penalty (default 1e-4)")
    ap.add_argument("--torch-seed", type=int, default=0, help="initialisation and shuffling seed (default 0)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "default"), help="model directory")
    ap.add_argument("--sample-out", default=os.path.join(ROOT, "data", "sample.tsv"), help="sample TSV")
    a = ap.parse_args()
    if subprocess.run([a.ember, "data", "synth", "--help"], capture_output=True).returncode != 0:
        sys.exit(f"train_default.py: {a.ember} has no working `data synth` (build: cargo build --release -p ember-cli)")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.torch_seed)
    table_rows = [a.table_rows] * 26
    t_start = time.time()

    with tempfile.TemporaryDirectory() as tmp:
        cmds = [synth(a.ember, a.rows, a.seed, os.path.join(tmp, "train.tsv")),
                synth(a.ember, a.val_rows, a.val_seed, os.path.join(tmp, "val.tsv"))]
        xd, xi, y = read_criteo(os.path.join(tmp, "train.tsv"), table_rows)
        vd, vi, vy = read_criteo(os.path.join(tmp, "val.tsv"), table_rows)
        print(f"train {len(y)} rows ({y.mean():.3f} positive), validation {len(vy)} rows ({vy.mean():.3f})")

        num_int = DIM + 27 * 26 // 2
        model = DLRMNet(DIM, table_rows, BOTTOM, [num_int] + TOP, "dot", False, seed=a.torch_seed)
        opt = torch.optim.Adam(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
        loss_fn = torch.nn.BCEWithLogitsLoss()
        xd_t, xi_t, y_t = torch.from_numpy(xd), torch.from_numpy(xi), torch.from_numpy(y)
        offs = [torch.arange(a.batch)] * 26
        best = (-1.0, None, 0)  # validation AUC, state, epoch: the best epoch is kept
        for epoch in range(a.epochs):
            model.train()
            perm = torch.randperm(len(y))
            total, t0 = 0.0, time.time()
            for s in range(0, len(y) - a.batch + 1, a.batch):  # full batches only
                idx = perm[s:s + a.batch]
                logits = model.logits(xd_t[idx], offs, list(xi_t[idx].T.contiguous()))[:, 0]
                loss = loss_fn(logits, y_t[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += loss.item() * a.batch
            model.eval()
            v_auc, v_ll = auc_logloss(vy, predict(model, vd, vi))
            print(f"epoch {epoch + 1}/{a.epochs}: train loss {total / (len(y) // a.batch * a.batch):.4f}, "
                  f"validation AUC {v_auc:.4f}, log loss {v_ll:.4f} ({time.time() - t0:.0f} s)", flush=True)
            if v_auc > best[0]:
                best = (v_auc, {k: v.clone() for k, v in model.state_dict().items()}, epoch + 1)
        model.load_state_dict(best[1])
        tr_auc, tr_ll = auc_logloss(y, predict(model, xd, xi))
        v_scores = predict(model, vd, vi)
        v_auc, v_ll = auc_logloss(vy, v_scores)
        print(f"kept epoch {best[2]}: train AUC {tr_auc:.4f} log loss {tr_ll:.4f}; "
              f"validation AUC {v_auc:.4f} log loss {v_ll:.4f}")

        ckpt = os.path.join(tmp, "dlrm_default.pt")
        torch.save({"state_dict": model.state_dict(), "epoch": best[2], "nepochs": a.epochs,
                    "train_auc": tr_auc, "test_auc": v_auc}, ckpt)
        arch = ["--arch-sparse-feature-size", str(DIM), "--arch-mlp-bot", "-".join(map(str, BOTTOM)),
                "--arch-mlp-top", "-".join(map(str, TOP)), "--arch-interaction-op", "dot"]
        argv = [sys.executable, os.path.join(ROOT, "tools", "export_torch.py"), "--from", "dlrm", ckpt, "--out", a.out]
        export = " ".join(["tools/export_torch.py --from dlrm CHECKPOINT --out", os.path.relpath(a.out, ROOT)] + arch)
        subprocess.run(argv + arch, check=True)

        ref = load_ember_model(a.out)
        with torch.inference_mode():
            ids = torch.from_numpy(np.ascontiguousarray(vi.T)).reshape(-1)
            got = torch.sigmoid(ref(torch.from_numpy(vd), torch.ones(26, len(vy), dtype=torch.long), ids)).numpy()
        diff = float(np.abs(got - v_scores).max())
        if diff > 1e-5:
            sys.exit(f"train_default.py: the exported model differs from the trained one by {diff:.3g}")

    os.makedirs(os.path.dirname(a.sample_out), exist_ok=True)
    sample_cmd = synth(a.ember, a.sample_rows, a.sample_seed, a.sample_out, os.path.relpath(a.sample_out, ROOT))
    size = os.path.getsize(os.path.join(a.out, "model.safetensors"))
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items()
                     if k not in ("ember", "out", "sample_out") and v != ap.get_default(k))
    with open(os.path.join(a.out, "README.md"), "w") as f:
        f.write(f"""# The default model

A facebookresearch/dlrm-style DLRM trained on synthetic Criteo-format data (`ember data synth`,
labels from a hidden teacher), shipped so that `ember predict` works without downloads.

- Architecture: dense 13 -> bottom MLP 13-64-16, 26 tables x {a.table_rows} rows x dim {DIM} f32 (ids
  hashed `int(hex, 16) % {a.table_rows}`), dot interaction without self pairs, top MLP {num_int}-128-64-1,
  sigmoid. `model.safetensors` is {size / 1e6:.2f} MB.
- Made by `~/.venvs/torch/bin/python tools/train_default.py{' ' + flags if flags else ''}` (torch {torch.__version__}):
  - `ember {cmds[0]}` (training rows), `ember {cmds[1]}` (validation rows);
  - Adam lr {a.lr}, weight decay {a.weight_decay}, batch {a.batch}, {a.epochs} epochs (kept epoch {best[2]}, the
    best on validation), BCE on the logits, initialisation and shuffling seed {a.torch_seed};
  - `python {export}`.
- Reached: train AUC {tr_auc:.4f} (log loss {tr_ll:.4f}), validation AUC {v_auc:.4f} (log loss {v_ll:.4f}).
- `data/sample.tsv`: `ember {sample_cmd}` (fresh rows, not used in training).

`tools/check_auc.py` compares `ember predict` with PyTorch on fresh rows.
""")
    print(f"wrote {a.out} ({size / 1e6:.2f} MB) and {a.sample_out} in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
