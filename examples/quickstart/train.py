"""A small real training job: a two-layer MLP trained with SGD on a synthetic two-moons problem.

Pure Python (standard library only), so it runs on any machine right after `pip install gpucloud`,
in a few seconds, with no GPU and nothing else to install. It writes what a real job would: a model
file (outputs/model.json) and metrics (metrics.json), which gpucloud brings back.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from pathlib import Path


def make_moons(n: int, noise: float, rng: random.Random) -> list[tuple[float, float, int]]:
    points = []
    for _ in range(n):
        t = rng.uniform(0, math.pi)
        upper = rng.random() < 0.5
        x = math.cos(t) if upper else 1 - math.cos(t)
        y = math.sin(t) if upper else 0.5 - math.sin(t)
        points.append((x + rng.gauss(0, noise), y + rng.gauss(0, noise), int(upper)))
    return points


class Mlp:
    """2 inputs -> `hidden` tanh units -> 1 sigmoid output."""

    def __init__(self, hidden: int, rng: random.Random) -> None:
        self.w1 = [[rng.gauss(0, 1) for _ in range(hidden)] for _ in range(2)]
        self.b1 = [0.0] * hidden
        self.w2 = [rng.gauss(0, 1 / math.sqrt(hidden)) for _ in range(hidden)]
        self.b2 = 0.0

    def forward(self, x: float, y: float) -> tuple[list[float], float]:
        h = [math.tanh(x * a + y * b + c) for a, b, c in zip(self.w1[0], self.w1[1], self.b1, strict=True)]
        z = sum(hi * wi for hi, wi in zip(h, self.w2, strict=True)) + self.b2
        return h, 1 / (1 + math.exp(-max(-60.0, min(60.0, z))))

    def step(self, x: float, y: float, label: int, lr: float) -> float:
        """One SGD step on one sample; returns its cross-entropy loss."""
        h, p = self.forward(x, y)
        g = p - label
        for i, hi in enumerate(h):
            gh = g * self.w2[i] * (1 - hi * hi)
            self.w2[i] -= lr * g * hi
            self.w1[0][i] -= lr * gh * x
            self.w1[1][i] -= lr * gh * y
            self.b1[i] -= lr * gh
        self.b2 -= lr * g
        return -math.log(p + 1e-9) if label else -math.log(1 - p + 1e-9)

    def accuracy(self, data: list[tuple[float, float, int]]) -> float:
        return sum((self.forward(x, y)[1] > 0.5) == bool(lab) for x, y, lab in data) / len(data)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=int(os.environ.get("EPOCHS", "30")))
    parser.add_argument("--hidden", type=int, default=12)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    rng = random.Random(0)
    data = make_moons(1200, 0.2, rng)
    train, test = data[:1000], data[1000:]
    model = Mlp(args.hidden, rng)

    start = time.time()
    loss = float("nan")
    for epoch in range(1, args.epochs + 1):
        rng.shuffle(train)
        loss = sum(model.step(x, y, lab, args.lr) for x, y, lab in train) / len(train)
        if epoch % max(1, args.epochs // 10) == 0 or epoch == 1:
            print(f"epoch {epoch:4d}  loss {loss:.4f}  test accuracy {model.accuracy(test):.3f}", flush=True)

    accuracy = model.accuracy(test)
    Path("outputs").mkdir(exist_ok=True)
    Path("outputs/model.json").write_text(json.dumps({"w1": model.w1, "b1": model.b1, "w2": model.w2, "b2": model.b2}))
    metrics = {
        "epochs": args.epochs,
        "final_loss": round(loss, 6),
        "test_accuracy": round(accuracy, 4),
        "train_seconds": round(time.time() - start, 3),
    }
    Path("metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(f"done: test accuracy {accuracy:.3f}; wrote outputs/model.json and metrics.json", flush=True)


if __name__ == "__main__":
    main()
