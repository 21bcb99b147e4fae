"""The article's model in native PyTorch: the reference catsdogs' profile is held to on a GPU.

The same network as catsdogs.training.model (Conv2D(32, 3x3, same) + ReLU, MaxPool 2x2, Flatten, Dense(128)
+ ReLU, Dense(1) on the logit; binary cross-entropy from the logit; Adam at Keras's defaults),
the images uint8 on the device and scaled by 1/255 in the model, as catsdogs feeds them. Each
batch size is warmed up, then `--steps` training steps are timed with CUDA events (on a CPU with
the wall clock); peak memory from PyTorch's allocator. The TF32 switches are set the way the Keras
run it is compared with was: `--tf32` allows TF32 for matmuls *and* convolutions, `--no-tf32`
forbids both (the H100 reference of ../shared/GPU.md ran matmuls in FP32 and convolutions in
TF32, a mix neither Keras backend can set; its 19,056 images/s are not comparable with either).
`--bf16` trains under bfloat16 autocast, beside Keras's mixed_bfloat16.

    python scripts/torch_reference.py --batch-size 16 64 256 1024 --tf32 --json torch-tf32.json
    python scripts/torch_reference.py --size 40 --batch-size 4 8 --steps 3    # anywhere, small

Needs PyTorch; nothing of catsdogs. Prints one line per batch size and writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

ADAM = {"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-7}  # Keras's Adam defaults


def build(size: int):
    import torch
    from torch import nn

    class ArticleCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 32, 3, padding="same")
            self.pool = nn.MaxPool2d(2)
            self.dense = nn.Linear(32 * (size // 2) * (size // 2), 128)
            self.out = nn.Linear(128, 1)

        def forward(self, images):  # uint8, (batch, size, size, 3): as catsdogs feeds Keras
            x = images.permute(0, 3, 1, 2).float() / 255.0
            x = self.pool(torch.relu(self.conv(x)))
            return self.out(torch.relu(self.dense(torch.flatten(x, 1)))).squeeze(1)

    return ArticleCNN()


def probe(batch_size: int, size: int, steps: int, warmup: int, device, bf16: bool) -> dict:
    import torch

    torch.manual_seed(0)
    model = build(size).to(device)
    optimizer = torch.optim.Adam(model.parameters(), **ADAM)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    images = torch.randint(0, 256, (batch_size, size, size, 3), dtype=torch.uint8, device=device)
    labels = torch.randint(0, 2, (batch_size,), device=device).float()
    gpu = device.type == "cuda"

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()

    if gpu:
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(warmup):
        step()
    if gpu:
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            step()
        end.record()
        torch.cuda.synchronize(device)
        seconds = start.elapsed_time(end) / 1000.0
    else:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        seconds = time.perf_counter() - t0
    return {"batch_size": batch_size, "status": "done", "images_per_second": batch_size * steps / seconds,
            "step_time_s": seconds / steps,
            "peak_memory_mb": torch.cuda.max_memory_allocated(device) / 2**20 if gpu else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-size", type=int, nargs="+", default=[16, 64, 256, 1024])
    ap.add_argument("--size", type=int, default=200, help="image side in pixels [200]")
    ap.add_argument("--steps", type=int, default=50, help="timed steps per batch size [50]")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first [5]")
    tf32 = ap.add_mutually_exclusive_group()
    tf32.add_argument("--tf32", dest="tf32", action="store_true", default=True,
                      help="allow TF32 for matmuls and convolutions [default]")
    tf32.add_argument("--no-tf32", dest="tf32", action="store_false", help="forbid TF32 for both")
    ap.add_argument("--bf16", action="store_true", help="bfloat16 autocast (the numbers of Keras's mixed_bfloat16)")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: no reference", file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cudnn.benchmark = True
    setting = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "tf32": args.tf32, "bf16": args.bf16, "size": args.size,
               "steps": args.steps, "warmup": args.warmup,
               "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
               "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
               "parameters": sum(p.numel() for p in build(args.size).parameters())}  # catsdogs': 40,961,153 at 200 px
    print(f"PyTorch {torch.__version__} on {setting['device']}: TF32 {'allowed' if args.tf32 else 'forbidden'}"
          f"{', bfloat16 autocast' if args.bf16 else ''}, {args.size} px", flush=True)
    rows = []
    for b in args.batch_size:
        try:
            row = probe(b, args.size, args.steps, args.warmup, device, args.bf16)
        except torch.cuda.OutOfMemoryError as e:
            row = {"batch_size": b, "status": "oom", "error": str(e).splitlines()[0]}
            torch.cuda.empty_cache()
        rows.append(row)
        if row["status"] == "done":
            mem = f", peak {row['peak_memory_mb']:.0f} MiB" if row["peak_memory_mb"] else ""
            print(f"batch size {b:>5}: {row['images_per_second']:.0f} images/s, "
                  f"{1000 * row['step_time_s']:.2f} ms/step{mem}", flush=True)
        else:
            print(f"batch size {b:>5}: out of memory", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"setting": setting, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
