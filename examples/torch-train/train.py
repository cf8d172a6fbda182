"""A small real PyTorch training job: an MLP on a synthetic classification task.

Synthetic data keeps it runnable anywhere (no dataset download); it uses the GPU when PyTorch sees
one and says so, and writes outputs/model.pt and metrics.json as the run's artifacts."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch import nn


def make_data(n: int, dim: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, dim, generator=gen) * 2.0
    labels = torch.randint(0, classes, (n,), generator=gen)
    points = centers[labels] + torch.randn(n, dim, generator=gen)
    return points, labels


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__} on {name} (node rank {os.environ.get('GPUCLOUD_NODE_RANK', '0')})", flush=True)

    torch.manual_seed(0)
    x, y = make_data(8192, 32, 10, seed=1)
    x_val, y_val = make_data(2048, 32, 10, seed=2)
    x, y, x_val, y_val = x.to(device), y.to(device), x_val.to(device), y_val.to(device)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    start = time.time()
    loss = torch.tensor(0.0)
    for epoch in range(1, args.epochs + 1):
        perm = torch.randperm(x.shape[0], device=device)
        for i in range(0, x.shape[0], args.batch_size):
            idx = perm[i : i + args.batch_size]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
        with torch.no_grad():
            acc = (model(x_val).argmax(1) == y_val).float().mean().item()
        print(f"epoch {epoch}/{args.epochs} loss {loss.item():.4f} val_acc {acc:.4f}", flush=True)

    out = Path("outputs")
    out.mkdir(exist_ok=True)
    torch.save(model.state_dict(), out / "model.pt")
    metrics = {
        "final_loss": round(loss.item(), 6),
        "val_accuracy": round(acc, 6),
        "epochs": args.epochs,
        "device": name,
        "seconds": round(time.time() - start, 3),
    }
    Path("metrics.json").write_text(json.dumps(metrics, indent=2))
    print(f"done: {metrics}", flush=True)


if __name__ == "__main__":
    main()
