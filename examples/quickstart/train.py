"""A small real training job: a two-layer MLP trained with numpy on a synthetic two-moons problem.

It runs on any machine (no GPU needed), finishes in seconds, and writes what a real job would:
a model file (outputs/model.npz) and metrics (metrics.json), which gpucloud brings back.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np


def make_moons(n: int, noise: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    t = rng.uniform(0, np.pi, n)
    upper = rng.random(n) < 0.5
    x = np.where(upper, np.cos(t), 1 - np.cos(t))
    y = np.where(upper, np.sin(t), 0.5 - np.sin(t))
    features = np.stack([x, y], axis=1) + rng.normal(0, noise, (n, 2))
    return features.astype(np.float32), upper.astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=int(os.environ.get("EPOCHS", "200")))
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x, y = make_moons(4000, 0.15, rng)
    split = 3200
    x_train, y_train, x_test, y_test = x[:split], y[:split], x[split:], y[split:]

    w1 = rng.normal(0, 1, (2, args.hidden)).astype(np.float32)
    b1 = np.zeros(args.hidden, np.float32)
    w2 = rng.normal(0, 1 / np.sqrt(args.hidden), (args.hidden, 1)).astype(np.float32)
    b2 = np.zeros(1, np.float32)

    def forward(inp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        hidden = np.tanh(inp @ w1 + b1)
        return hidden, 1 / (1 + np.exp(-(hidden @ w2 + b2)[:, 0]))

    start = time.time()
    loss = float("nan")
    for epoch in range(1, args.epochs + 1):
        hidden, prob = forward(x_train)
        eps = 1e-7
        loss = float(-np.mean(y_train * np.log(prob + eps) + (1 - y_train) * np.log(1 - prob + eps)))
        grad_out = ((prob - y_train) / len(y_train))[:, None]
        grad_w2 = hidden.T @ grad_out
        grad_hidden = (grad_out @ w2.T) * (1 - hidden**2)
        w2 -= args.lr * grad_w2
        b2 -= args.lr * grad_out.sum(0)
        w1 -= args.lr * (x_train.T @ grad_hidden)
        b1 -= args.lr * grad_hidden.sum(0)
        if epoch % max(1, args.epochs // 10) == 0 or epoch == 1:
            acc = float(np.mean((forward(x_test)[1] > 0.5) == y_test))
            print(f"epoch {epoch:4d}  loss {loss:.4f}  test accuracy {acc:.3f}", flush=True)

    accuracy = float(np.mean((forward(x_test)[1] > 0.5) == y_test))
    Path("outputs").mkdir(exist_ok=True)
    np.savez("outputs/model.npz", w1=w1, b1=b1, w2=w2, b2=b2)
    metrics = {"epochs": args.epochs, "final_loss": round(loss, 6), "test_accuracy": round(accuracy, 4),
               "train_seconds": round(time.time() - start, 3)}
    Path("metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(f"done: test accuracy {accuracy:.3f}; wrote outputs/model.npz and metrics.json", flush=True)


if __name__ == "__main__":
    main()
