"""PyTorch DistributedDataParallel on a synthetic classification task, one process per GPU on every
node (torchrun starts them): NCCL with GPUs, gloo on CPUs (the local provider on a CPU-only host).

Every rank starts from the same weights (DDP broadcasts rank 0's) and DDP all-reduces the gradients,
so the parameters stay identical; the reported loss is the mean over all ranks (an all_reduce), so
every rank prints, and writes into metrics.json, the same final loss. Rank 0 also saves the model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_data(n: int, dim: int, classes: int, seed: int) -> TensorDataset:
    """The same synthetic dataset on every rank (a fixed seed): the sampler splits it."""
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, dim, generator=gen) * 2.0
    labels = torch.randint(0, classes, (n,), generator=gen)
    return TensorDataset(centers[labels] + torch.randn(n, dim, generator=gen), labels)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()

    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    one_host = master.startswith("127.")  # every node on this machine (the local provider)
    world_env = int(os.environ.get("WORLD_SIZE", "1"))
    # NCCL needs one GPU per rank: nodes sharing one host share its GPUs, so they may be too few.
    use_cuda = torch.cuda.is_available() and (not one_host or torch.cuda.device_count() >= world_env)
    if not use_cuda and one_host and "GLOO_SOCKET_IFNAME" not in os.environ:
        # Every node on this host (loopback): keep gloo off interfaces the hostname may resolve to.
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # On one host the global rank picks the GPU (every node's torchrun counts LOCAL_RANK from 0).
    local_rank = rank if one_host else int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        if one_host:  # all ranks share this host's cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    node = os.environ.get("GPUCLOUD_NODE_RANK", "0")
    where = f"cuda:{local_rank} {torch.cuda.get_device_name(local_rank)}" if use_cuda else "CPU"
    print(
        f"rank {rank}/{world} (node {node}) on {where}, backend {dist.get_backend()}, "
        f"master {master}:{os.environ.get('MASTER_PORT')}",
        flush=True,
    )

    torch.manual_seed(0)
    data = make_data(args.samples, 32, 10, seed=1)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    start = time.time()
    mean_loss = 0.0
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, dtype=torch.float64, device=device)  # (sum of losses, samples)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item() * len(y), len(y)], dtype=torch.float64, device=device)
        dist.all_reduce(total)  # every rank gets the same sums: the same mean
        mean_loss = (total[0] / total[1]).item()
        if rank == 0:
            print(f"epoch {epoch}/{args.epochs} loss {mean_loss:.6f}", flush=True)

    print(f"rank {rank} final loss {mean_loss:.6f}", flush=True)
    metrics = {
        "rank": rank,
        "world_size": world,
        "node_rank": int(node),
        "final_loss": mean_loss,
        "epochs": args.epochs,
        "backend": dist.get_backend(),
        "seconds": round(time.time() - start, 3),
    }
    Path("metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    if rank == 0:
        out = Path("outputs")
        out.mkdir(exist_ok=True)
        torch.save(model.state_dict(), out / "model.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Everything is written and printed. Gloo's worker threads may still be releasing the last
    # collectives' tensors, which takes the interpreter's lock: if the interpreter is being torn down
    # by then, the rank aborts (SIGABRT, "terminate called without an active exception") and torchrun
    # fails the run after training succeeded. So this process ends without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
