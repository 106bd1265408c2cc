"""Train a Hugging Face VLM on a vlmdata dataset with `transformers.Trainer` (`vlmdata.hf.VLMTrainer`).

One process, or several under `accelerate launch` (or torchrun):

    python -m vlmdata_pipelines.hf_trainer --data DATASET --model MODEL_DIR --epochs 2 --out OUT
    accelerate launch --multi_gpu --num_processes 2 -m vlmdata_pipelines.hf_trainer --data DATASET --model MODEL_DIR ...

MODEL_DIR is a model folder of any family vlmdata knows (config.json and
preprocessor_config.json; weights are loaded when present, otherwise the model
is randomly initialised from the config). The dataset's images follow the
model's processor (`ModelSpec.image_policy()`), its packs go through the
family's output adapter, and each rank reads its own packs (the loader is not
`accelerator.prepare`d; see `vlmdata.hf.trainer`). On a machine without CUDA
the processes use the CPU and gloo (`use_cpu=True`).

Each rank writes OUT/result.rank{r}.json: the sample keys it trained on, by
epoch (from each pack's provenance), and the logged losses.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections import defaultdict

import torch

log = logging.getLogger("vlmdata_pipelines.hf_trainer")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vlmdata_pipelines.hf_trainer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="vlmdata dataset (directory or URL with manifest.json)")
    p.add_argument("--model", required=True, help="Hugging Face model folder of any family vlmdata knows")
    p.add_argument("--out", required=True, help="output directory (Trainer output, per-rank results)")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--max-steps", type=int, default=-1, help="optimizer steps (overrides --epochs when > 0)")
    p.add_argument("--max-tokens", type=int, default=2048, help="tokens per pack")
    p.add_argument("--accum", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--num-workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--attn", default="auto", help="attention implementation (auto: flash_attention_2 on a GPU "
                                                  "that has it, else vlmdata_varlen; or sdpa, eager)")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from transformers import TrainingArguments

    from vlmdata.hf import ModelSpec, VLMTrainer, load_model
    from vlmdata.loading import VLMDataset

    cuda = torch.cuda.is_available()
    training = TrainingArguments(
        output_dir=args.out, num_train_epochs=args.epochs, max_steps=args.max_steps, learning_rate=args.lr,
        gradient_accumulation_steps=args.accum, per_device_train_batch_size=1, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, logging_steps=1, save_strategy="no", report_to=[], seed=args.seed,
        dataloader_num_workers=args.num_workers, dataloader_pin_memory=cuda, use_cpu=not cuda,
        bf16=cuda and torch.cuda.is_bf16_supported(), disable_tqdm=True)
    spec = ModelSpec.from_folder(args.model)
    torch.manual_seed(args.seed)                 # the same initial weights on every rank
    device = training.device                     # initialises the process group under accelerate launch
    model = load_model(args.model, attn_implementation=args.attn, device=device)
    dataset = VLMDataset(args.data, seed=args.seed, max_tokens=args.max_tokens, image_size=spec.image_policy())
    keys = defaultdict(list)

    def on_pack(meta: dict) -> None:
        keys[int(meta["state"]["epoch"])].extend(meta.get("sample_keys", []))

    trainer = VLMTrainer(model=model, args=training, train_dataset=dataset, spec=spec, on_pack=on_pack)
    trainer.train()
    rank = training.process_index
    result = {"rank": rank, "world_size": training.world_size, "keys_by_epoch": {str(e): k for e, k in keys.items()},
              "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
              "steps": trainer.state.global_step, "attention": trainer.adapter.attn_implementation,
              "loader_stats": trainer.loader_stats.to_dict()}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"result.rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if rank == 0:
        losses = result["losses"]
        log.info("done: %d steps on %d rank(s); loss %.4f -> %.4f", result["steps"], training.world_size,
                 losses[0] if losses else float("nan"), losses[-1] if losses else float("nan"))
    return 0


def close_process_group() -> None:
    """Destroy the process group `TrainingArguments` started, if any: left to interpreter exit, gloo's threads
    can abort a rank after training ("terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        code = main()
    finally:
        close_process_group()
    sys.exit(code)
